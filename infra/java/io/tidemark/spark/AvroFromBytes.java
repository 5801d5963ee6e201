package io.tidemark.spark;

import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.AvroRuntimeException;
import org.apache.avro.LogicalType;
import org.apache.avro.LogicalTypes;
import org.apache.avro.Schema;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.ResolvingDecoder;
import org.apache.avro.util.Utf8;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;

/**
 * {@code format: avro}'s decode: a Confluent-framed Avro value (magic byte 0, the writer
 * schema's 4-byte id, the body) read with its <em>writer's</em> schema straight into the
 * <em>reader's</em> columns by Avro's schema resolution (Avro's own {@link ResolvingDecoder}:
 * a field the writer lacks takes the reader's default, an int read as a long widens), the
 * columns being what spark-avro's {@code from_avro} makes of the reader schema.
 *
 * <p>Why not {@code from_avro}, one branch per writer id: it decodes each record into an Avro
 * {@code GenericRecord} and converts that into Spark's row, two passes and an object per
 * field; this reads each value once into the row. Only readers whose every type this knows
 * come here (records, single-type unions with null, primitives, enums, fixed, arrays, maps,
 * date, timestamps, decimals): pipelines.avro sends any other to {@code from_avro}.
 *
 * <p>Registered by infra/udfs.py as {@code tidemark_from_avro(value, writers, reader,
 * subject, schema)}: {@code writers} a constant map of schema id to that version's schema
 * text, {@code reader} the reader schema's text, {@code schema} the result struct in Spark's
 * JSON form: the reader's fields as {@code from_avro} types them, then one string field that
 * holds why a value did not decode (null when it did; every other field is then null).
 */
public final class AvroFromBytes extends FramedDecoder {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_from_avro";

    private final MapData writers;
    private final String reader;
    private final String subject;
    private transient Map<Integer, ResolvingDecoder> decoders;
    private transient Schema readerSchema;
    private transient BinaryDecoder binary;

    public AvroFromBytes(Expression child, MapData writers, String reader, String subject, StructType schema) {
        super(child, schema);
        this.writers = writers;
        this.reader = reader;
        this.subject = subject;
    }

    /** Registers the function in {@code spark}'s session (what infra/udfs.py calls through py4j). */
    public static void register(SparkSession spark) {
        register(spark, NAME, AvroFromBytes.class, new Builder());
    }

    private static final class Builder extends AbstractFunction1<Seq<Expression>, Expression>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public Expression apply(Seq<Expression> args) {
            String usage = NAME + "(value, writers, reader, subject, schema)";
            check(args, 5, usage);
            StructType schema = struct(args.apply(4), usage);
            return new AvroFromBytes(args.apply(0), (MapData) args.apply(1).eval(null),
                    String.valueOf(args.apply(2).eval(null)), String.valueOf(args.apply(3).eval(null)),
                    schema);
        }
    }

    private Map<Integer, ResolvingDecoder> decoders() throws IOException {
        if (decoders == null) {
            readerSchema = new Schema.Parser().parse(reader);
            Map<Integer, ResolvingDecoder> built = new HashMap<>();
            ArrayData ids = writers.keyArray();
            ArrayData texts = writers.valueArray();
            for (int i = 0; i < writers.numElements(); i++) {
                Schema writer = new Schema.Parser().parse(texts.getUTF8String(i).toString());
                built.put(ids.getInt(i), DecoderFactory.get().resolvingDecoder(
                        Schema.applyAliases(writer, readerSchema), readerSchema, null));
            }
            decoders = built;
        }
        return decoders;
    }

    @Override
    InternalRow decode(byte[] value) throws Refused {
        if (value.length < 5 || value[0] != 0) {
            throw new Refused("not Confluent-framed Avro: no magic byte 0 and 4-byte schema id");
        }
        int id = schemaId(value);
        ResolvingDecoder in;
        try {
            in = decoders().get(id);
        } catch (IOException | AvroRuntimeException e) {
            throw new IllegalStateException(NAME + ": the schemas of subject " + subject + " do not parse", e);
        }
        if (in == null) {
            throw new Refused("unknown schema id " + Integer.toUnsignedString(id) + " (not a version of subject "
                    + subject + " in the registry)");
        }
        binary = DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, binary);
        Object[] values = new Object[schema.fields().length];
        try {
            in.configure(binary);
            readFields(in, schema, values);
            in.drain();
        } catch (IOException | RuntimeException e) {  // EOF, a bad length or index, Avro's refusals
            throw new Refused("value does not decode as Avro with schema id " + id + ": " + e);
        }
        return new GenericInternalRow(values);
    }

    private static void readFields(ResolvingDecoder in, StructType type, Object[] into)
            throws IOException {
        for (Schema.Field field : in.readFieldOrder()) {
            int at = field.pos();
            into[at] = read(in, field.schema(), type.fields()[at].dataType());
        }
    }

    private static Object read(ResolvingDecoder in, Schema avro, DataType type) throws IOException {
        LogicalType logical = avro.getLogicalType();
        switch (avro.getType()) {
            case NULL:
                in.readNull();
                return null;
            case BOOLEAN:
                return in.readBoolean();
            case INT:
                return in.readInt();  // a date's days are Spark's DateType too
            case LONG: {
                long number = in.readLong();
                if (logical instanceof LogicalTypes.TimestampMillis || logical instanceof LogicalTypes.LocalTimestampMillis) {
                    return Math.multiplyExact(number, 1000L);
                }
                return number;
            }
            case FLOAT:
                return in.readFloat();
            case DOUBLE:
                return in.readDouble();
            case STRING: {
                Utf8 text = in.readString(null);
                return UTF8String.fromBytes(text.getBytes(), 0, text.getByteLength());
            }
            case ENUM:
                return UTF8String.fromString(avro.getEnumSymbols().get(in.readEnum()));
            case BYTES: {
                ByteBuffer bytes = in.readBytes(null);
                byte[] out = new byte[bytes.remaining()];
                bytes.get(out);
                return logical instanceof LogicalTypes.Decimal ? decimal(out, (DecimalType) type) : out;
            }
            case FIXED: {
                byte[] out = new byte[avro.getFixedSize()];
                in.readFixed(out);
                return logical instanceof LogicalTypes.Decimal ? decimal(out, (DecimalType) type) : out;
            }
            case UNION: {
                Schema branch = avro.getTypes().get(in.readIndex());
                return read(in, branch, type);
            }
            case RECORD: {
                StructType struct = (StructType) type;
                Object[] values = new Object[struct.fields().length];
                readFields(in, struct, values);
                return new GenericInternalRow(values);
            }
            case ARRAY: {
                DataType element = ((ArrayType) type).elementType();
                List<Object> items = new java.util.ArrayList<>();
                for (long n = in.readArrayStart(); n != 0; n = in.arrayNext()) {
                    for (long i = 0; i < n; i++) {
                        items.add(read(in, avro.getElementType(), element));
                    }
                }
                return new GenericArrayData(items.toArray());
            }
            case MAP: {
                DataType valueType = ((MapType) type).valueType();
                List<Object> keys = new java.util.ArrayList<>();
                List<Object> values = new java.util.ArrayList<>();
                for (long n = in.readMapStart(); n != 0; n = in.mapNext()) {
                    for (long i = 0; i < n; i++) {
                        Utf8 key = in.readString(null);
                        keys.add(UTF8String.fromBytes(key.getBytes(), 0, key.getByteLength()));
                        values.add(read(in, avro.getValueType(), valueType));
                    }
                }
                return new ArrayBasedMapData(new GenericArrayData(keys.toArray()), new GenericArrayData(values.toArray()));
            }
            default:
                throw new IllegalStateException(NAME + ": no reading of Avro type " + avro.getType());
        }
    }

    private static Decimal decimal(byte[] unscaled, DecimalType type) {
        BigDecimal exact = new BigDecimal(new BigInteger(unscaled), type.scale());
        return Decimal.apply(exact, type.precision(), type.scale());
    }

    @Override
    public Expression withNewChildrenInternal(scala.collection.immutable.IndexedSeq<Expression> children) {
        return new AvroFromBytes(children.apply(0), writers, reader, subject, schema);
    }

    @Override
    String name() {
        return NAME;
    }

    @Override
    Object[] fields() {
        return new Object[] {child, writers, reader, subject, schema};
    }
}
