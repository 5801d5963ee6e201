package io.tidemark.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;

/**
 * What the decoders of Confluent-framed values share ({@link AvroFromBytes},
 * {@link ProtobufFromBytes}): one binary child, the value; constant arguments after it; a
 * struct result whose last field says why a value did not decode (then every other field is
 * null), so that the ingest quarantines the record with that reason instead of failing the
 * batch.
 */
abstract class FramedDecoder extends TidemarkExpression {
    private static final long serialVersionUID = 1L;

    final Expression child;
    final StructType schema;

    FramedDecoder(Expression child, StructType schema) {
        this.child = child;
        this.schema = schema;
    }

    /** Why a value is quarantined (no stack trace: it is an answer, not a failure). */
    static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;

        Refused(String reason) {
            super(reason, null, false, false);
        }
    }

    /** The value's row, the result's last field left null. */
    abstract InternalRow decode(byte[] value) throws Refused;

    /** The arguments' count and kinds: a binary value, then constants; else what the call must look like. */
    static void check(Seq<Expression> args, int count, String usage) {
        if (args.size() != count) {
            throw new IllegalArgumentException(usage);
        }
        for (int i = 1; i < count; i++) {
            if (!args.apply(i).foldable()) {
                throw new IllegalArgumentException(usage + ": every argument but the value must be a constant");
            }
        }
        if (!args.apply(0).dataType().equals(DataTypes.BinaryType)) {
            throw new IllegalArgumentException(usage + ": the value must be binary");
        }
    }

    /** A constant argument holding a struct in Spark's JSON form, every field nullable. */
    static StructType struct(Expression argument, String usage) {
        DataType given = DataType.fromJson(String.valueOf(argument.eval(null)));
        if (!(given instanceof StructType)) {
            throw new IllegalArgumentException(usage + ": the schema must be a struct");
        }
        return (StructType) given.asNullable();
    }

    /** The frame's schema id (bytes 1 to 4, big-endian). */
    static int schemaId(byte[] value) {
        return ((value[1] & 0xFF) << 24) | ((value[2] & 0xFF) << 16) | ((value[3] & 0xFF) << 8) | (value[4] & 0xFF);
    }

    @Override
    public Object eval(InternalRow row) {
        Object input = child.eval(row);
        if (input == null) {
            return null;
        }
        try {
            return decode((byte[]) input);
        } catch (Refused refused) {
            Object[] values = new Object[schema.fields().length];
            values[values.length - 1] = UTF8String.fromString(refused.getMessage());
            return new GenericInternalRow(values);
        }
    }

    @Override
    public Seq<Expression> children() {
        return seq(child);
    }

    @Override
    public DataType dataType() {
        return schema;
    }

    @Override
    public boolean nullable() {
        return true;
    }
}
