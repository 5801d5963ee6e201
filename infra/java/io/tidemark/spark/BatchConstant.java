package io.tidemark.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.types.DataType;
import scala.Option;
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
public final class BatchConstant extends Expression implements CodegenFallback, java.io.Serializable {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_batch_constant";

    private final Expression child;

    public BatchConstant(Expression child) {
        this.child = child;
    }

    public static void register(SparkSession spark) {
        FunctionIdentifier name = new FunctionIdentifier(NAME, Option.empty(), Option.empty());
        ExpressionInfo info = new ExpressionInfo(BatchConstant.class.getName(), NAME);
        spark.sessionState().functionRegistry().registerFunction(name, info, new Builder());
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
        return scala.jdk.javaapi.CollectionConverters.asScala(java.util.List.of(child)).toList();
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
    public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
        return CodegenFallback.super.doGenCode(ctx, ev);
    }

    @Override
    public String prettyName() {
        return NAME;
    }

    @Override
    public int productArity() {
        return 1;
    }

    @Override
    public Object productElement(int n) {
        if (n != 0) {
            throw new IndexOutOfBoundsException(String.valueOf(n));
        }
        return child;
    }

    @Override
    public boolean canEqual(Object that) {
        return that instanceof BatchConstant;
    }

    @Override
    public boolean equals(Object that) {
        return that instanceof BatchConstant && child.equals(((BatchConstant) that).child);
    }

    @Override
    public int hashCode() {
        return 31 * child.hashCode() + 7;
    }
}
