package io.tidemark.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.types.DataType;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;

/**
 * {@code tidemark_batch_constant(literal)}: the literal's value, kept out of Spark's generated code.
 *
 * <p>Why: Spark writes a long or timestamp literal into the Java source it generates for a
 * stage, and caches compiled stages by their source. A batch's id and its planning instant
 * differ from one batch to the next, so every batch of a long-lived session ({@code --follow},
 * {@code tidemark serve}) compiled its write stage anew, and the JVM's JIT started over on the
 * new classes. Behind this expression the value stays in the plan's reference objects (as a
 * string literal does), the source is the same for every batch, and one compiled class serves
 * them all. The optimiser does not fold it (it is not foldable), so it cannot turn back into
 * an inlined literal. Its per-row cost is one virtual call returning the same object.
 */
public final class BatchConstant extends TidemarkExpression {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_batch_constant";

    private final Expression child;

    public BatchConstant(Expression child) {
        this.child = child;
    }

    public static void register(SparkSession spark) {
        register(spark, NAME, BatchConstant.class, new Builder());
    }

    private static final class Builder extends AbstractFunction1<Seq<Expression>, Expression>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public Expression apply(Seq<Expression> args) {
            if (args.size() != 1 || !args.apply(0).foldable()) {
                throw new IllegalArgumentException(NAME + "(value): the value must be a constant");
            }
            return new BatchConstant(args.apply(0));
        }
    }

    @Override
    public Object eval(InternalRow row) {
        return child.eval(row);
    }

    @Override
    public boolean foldable() {
        return false;
    }

    @Override
    public Seq<Expression> children() {
        return seq(child);
    }

    @Override
    public DataType dataType() {
        return child.dataType();
    }

    @Override
    public boolean nullable() {
        return child.nullable();
    }

    @Override
    public Expression withNewChildrenInternal(scala.collection.immutable.IndexedSeq<Expression> children) {
        return new BatchConstant(children.apply(0));
    }

    @Override
    String name() {
        return NAME;
    }

    @Override
    Object[] fields() {
        return new Object[] {child};
    }
}
