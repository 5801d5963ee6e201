package io.tidemark.spark;

import java.util.Arrays;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import scala.Function1;
import scala.Option;
import scala.collection.immutable.Seq;

/**
 * What Tidemark's Catalyst expressions share: evaluated through {@code eval} (Spark calls it
 * from its generated code), registered by name in a session, and equal when their class and
 * {@link #fields()} are, which is how Catalyst compares and de-duplicates expressions.
 */
abstract class TidemarkExpression extends Expression implements CodegenFallback, java.io.Serializable {
    private static final long serialVersionUID = 1L;

    /** The SQL name the expression is registered under. */
    abstract String name();

    /** The children and whatever else tells two instances apart, in a fixed order. */
    abstract Object[] fields();

    static void register(SparkSession spark, String name, Class<?> type, Function1<Seq<Expression>, Expression> builder) {
        FunctionIdentifier id = new FunctionIdentifier(name, Option.empty(), Option.empty());
        spark.sessionState().functionRegistry().registerFunction(id, new ExpressionInfo(type.getName(), name), builder);
    }

    static Seq<Expression> seq(Expression... expressions) {
        return scala.jdk.javaapi.CollectionConverters.asScala(java.util.List.of(expressions)).toList();
    }

    @Override
    public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
        return CodegenFallback.super.doGenCode(ctx, ev);
    }

    @Override
    public String prettyName() {
        return name();
    }

    @Override
    public int productArity() {
        return fields().length;
    }

    @Override
    public Object productElement(int n) {
        Object[] fields = fields();
        if (n < 0 || n >= fields.length) {
            throw new IndexOutOfBoundsException(String.valueOf(n));
        }
        return fields[n];
    }

    @Override
    public boolean canEqual(Object that) {
        return that != null && that.getClass() == getClass();
    }

    @Override
    public boolean equals(Object that) {
        return canEqual(that) && Arrays.equals(fields(), ((TidemarkExpression) that).fields());
    }

    @Override
    public int hashCode() {
        return 31 * getClass().getName().hashCode() + Arrays.hashCode(fields());
    }
}
