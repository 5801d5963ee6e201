package io.tidemark.spark;

import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.InvalidProtocolBufferException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;

/**
 * {@code format: protobuf}'s decode: a Confluent-framed Protobuf value (magic byte 0, the
 * writer schema's 4-byte id, the message indexes, the body) parsed with its <em>writer's</em>
 * descriptor, then read into the pipeline's reader message field by field <em>number</em>, as
 * Protobuf itself resolves versions: a field the writer lacks takes the reader's default (null
 * where the field has presence), a field the reader lacks is dropped, an int32 read as an int64
 * widens, an enum reads as its value's name.
 *
 * <p>Registered by infra/udfs.py as {@code tidemark_from_protobuf(value, writers, message,
 * reader, subject, schema)}: {@code writers} a constant map of schema id to that version's
 * serialized {@code FileDescriptorSet} (the driver compiles each .proto once; its last file is
 * the schema itself), {@code message} the reader message's full name, {@code reader} the id of
 * the version whose message the columns follow, {@code schema} the result struct in Spark's JSON
 * form: the reader message's fields, in its descriptor's order, then one string field that
 * holds why a value did not decode (null when it did; every other field is then null).
 *
 * <p>Why Tidemark's own: Maven Central serves no {@code spark-protobuf}, and it takes one
 * descriptor per column where a topic's records carry several writer versions.
 */
public final class ProtobufFromBytes extends TidemarkExpression {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_from_protobuf";
    /** At most this many message indexes in a frame: a nesting deeper than any real schema's. */
    private static final int MAX_INDEXES = 64;

    private final Expression child;
    private final MapData writers;
    private final String message;
    private final int reader;
    private final String subject;
    private final StructType schema;
    private transient Map<Integer, Writer> decoders;

    public ProtobufFromBytes(Expression child, MapData writers, String message, int reader, String subject,
                             StructType schema) {
        this.child = child;
        this.writers = writers;
        this.message = message;
        this.reader = reader;
        this.subject = subject;
        this.schema = schema;
    }

    /** Registers the function in {@code spark}'s session (what infra/udfs.py calls through py4j). */
    public static void register(SparkSession spark) {
        register(spark, NAME, ProtobufFromBytes.class, new Builder());
    }

    private static final class Builder extends AbstractFunction1<Seq<Expression>, Expression>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public Expression apply(Seq<Expression> args) {
            if (args.size() != 6) {
                throw new IllegalArgumentException(NAME + "(value, writers, message, reader, subject, schema)");
            }
            for (int i = 1; i < 6; i++) {
                if (!args.apply(i).foldable()) {
                    throw new IllegalArgumentException(NAME + ": every argument but the value must be a constant");
                }
            }
            if (!args.apply(0).dataType().equals(DataTypes.BinaryType)) {
                throw new IllegalArgumentException(NAME + ": the value must be binary");
            }
            DataType given = DataType.fromJson(String.valueOf(args.apply(5).eval(null)));
            if (!(given instanceof StructType)) {
                throw new IllegalArgumentException(NAME + ": the schema must be a struct");
            }
            return new ProtobufFromBytes(args.apply(0), (MapData) args.apply(1).eval(null),
                    String.valueOf(args.apply(2).eval(null)), ((Number) args.apply(3).eval(null)).intValue(),
                    String.valueOf(args.apply(4).eval(null)), (StructType) given.asNullable());
        }
    }

    /** Why a value is quarantined. */
    private static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;

        Refused(String reason) {
            super(reason, null, false, false);
        }
    }

    /** One writer version: its file and, per message it holds, how to read it into the reader's. */
    private static final class Writer {
        final int id;
        final FileDescriptor file;
        final Map<Descriptor, Resolution> resolutions = new HashMap<>();

        Writer(int id, FileDescriptor file) {
            this.id = id;
            this.file = file;
        }
    }

    /** A writer message read into a reader message: per reader field, the writer's field of its number. */
    private static final class Resolution {
        final FieldDescriptor[] readerFields;
        final FieldDescriptor[] writerFields;
        final DataType[] types;
        final Resolution[] nested;

        Resolution(Descriptor writer, Descriptor reader, StructType type) throws Refused {
            List<FieldDescriptor> fields = reader.getFields();
            if (fields.size() != type.fields().length) {
                throw new Refused("the reader schema of message " + reader.getFullName() + " does not match its columns");
            }
            int n = fields.size();
            readerFields = fields.toArray(new FieldDescriptor[0]);
            writerFields = new FieldDescriptor[n];
            types = new DataType[n];
            nested = new Resolution[n];
            for (int i = 0; i < n; i++) {
                FieldDescriptor field = readerFields[i];
                types[i] = type.fields()[i].dataType();
                FieldDescriptor written = writer.findFieldByNumber(field.getNumber());
                writerFields[i] = written;
                if (written == null) {
                    continue;
                }
                boolean readerMessage = field.getJavaType() == FieldDescriptor.JavaType.MESSAGE;
                boolean writerMessage = written.getJavaType() == FieldDescriptor.JavaType.MESSAGE;
                if (readerMessage != writerMessage || field.isRepeated() != written.isRepeated()
                        || field.isMapField() != written.isMapField()) {
                    throw new Refused("field " + field.getName() + " is " + kind(written) + " in the writer's schema and "
                            + kind(field) + " in the reader's");
                }
                DataType element = types[i] instanceof ArrayType a ? a.elementType() : types[i];
                if (readerMessage && element instanceof StructType struct && !field.isMapField()) {
                    nested[i] = new Resolution(written.getMessageType(), field.getMessageType(), struct);
                } else if (field.isMapField()) {
                    MapType map = (MapType) types[i];
                    Descriptor entry = field.getMessageType();
                    StructType pair = new StructType(new StructField[] {
                            new StructField("key", map.keyType(), true, org.apache.spark.sql.types.Metadata.empty()),
                            new StructField("value", map.valueType(), true, org.apache.spark.sql.types.Metadata.empty())});
                    nested[i] = new Resolution(written.getMessageType(), entry, pair);
                }
            }
        }
    }

    private static String kind(FieldDescriptor field) {
        String base = field.getJavaType() == FieldDescriptor.JavaType.MESSAGE
                ? field.getMessageType().getFullName() : field.getType().name().toLowerCase();
        return field.isMapField() ? "a map" : field.isRepeated() ? "repeated " + base : base;
    }

    private Map<Integer, Writer> decoders() {
        if (decoders == null) {
            Map<Integer, Writer> built = new ConcurrentHashMap<>();
            ArrayData ids = writers.keyArray();
            ArrayData sets = writers.valueArray();
            for (int i = 0; i < writers.numElements(); i++) {
                int id = ids.getInt(i);
                try {
                    built.put(id, new Writer(id, file(FileDescriptorSet.parseFrom(sets.getBinary(i)))));
                } catch (InvalidProtocolBufferException | DescriptorValidationException e) {
                    throw new IllegalArgumentException(NAME + ": schema id " + id + "'s descriptors: " + e.getMessage(), e);
                }
            }
            decoders = built;
        }
        return decoders;
    }

    /** The set's last file (the schema), built on the files before it (its imports, in dependency order). */
    private static FileDescriptor file(FileDescriptorSet set) throws DescriptorValidationException {
        Map<String, FileDescriptor> built = new HashMap<>();
        FileDescriptor last = null;
        for (FileDescriptorProto proto : set.getFileList()) {
            List<FileDescriptor> deps = new ArrayList<>();
            for (String dep : proto.getDependencyList()) {
                FileDescriptor found = built.get(dep);
                if (found != null) {
                    deps.add(found);
                }
            }
            last = FileDescriptor.buildFrom(proto, deps.toArray(new FileDescriptor[0]), true);
            built.put(proto.getName(), last);
        }
        if (last == null) {
            throw new IllegalArgumentException(NAME + ": an empty descriptor set");
        }
        return last;
    }

    private Descriptor readerMessage() throws Refused {
        Writer own = decoders().get(reader);
        Descriptor found = own == null ? null : named(own.file.getMessageTypes(), message);
        if (found == null) {
            throw new Refused("message " + message + " is not in the reader schema (id " + reader + ")");
        }
        return found;
    }

    /** The message of this full name among {@code messages} and the messages nested in them. */
    private static Descriptor named(List<Descriptor> messages, String fullName) {
        for (Descriptor candidate : messages) {
            if (candidate.getFullName().equals(fullName)) {
                return candidate;
            }
            Descriptor nested = named(candidate.getNestedTypes(), fullName);
            if (nested != null) {
                return nested;
            }
        }
        return null;
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

    private InternalRow decode(byte[] value) throws Refused {
        if (value.length < 6 || value[0] != 0) {
            throw new Refused("not Confluent-framed Protobuf: no magic byte 0, 4-byte schema id and message indexes");
        }
        int id = ((value[1] & 0xFF) << 24) | ((value[2] & 0xFF) << 16) | ((value[3] & 0xFF) << 8) | (value[4] & 0xFF);
        Writer writer = decoders().get(id);
        if (writer == null) {
            throw new Refused("unknown schema id " + Integer.toUnsignedString(id) + " (not a version of subject "
                    + subject + " in the registry)");
        }
        CodedInputStream in = CodedInputStream.newInstance(value, 5, value.length - 5);
        Descriptor written;
        DynamicMessage parsed;
        try {
            written = indexed(writer, in);
            parsed = DynamicMessage.parseFrom(written, in);
        } catch (IOException e) {  // InvalidProtocolBufferException, and a truncated varint of the indexes
            throw new Refused("value does not decode as Protobuf with schema id " + id + ": " + e.getMessage());
        }
        if (!written.getFullName().equals(message)) {
            throw new Refused("schema id " + id + "'s message " + written.getFullName() + " is not the pipeline's "
                    + "message " + message);
        }
        Resolution resolution = writer.resolutions.get(written);
        if (resolution == null) {
            StructType payload = new StructType(java.util.Arrays.copyOf(schema.fields(), schema.fields().length - 1));
            resolution = new Resolution(written, readerMessage(), payload);
            writer.resolutions.put(written, resolution);
        }
        Object[] values = new Object[schema.fields().length];
        read(parsed, resolution, values);
        return new GenericInternalRow(values);
    }

    /** The message the frame's indexes name: Confluent writes their count first, and 0 alone for [0]. */
    private static Descriptor indexed(Writer writer, CodedInputStream in) throws IOException, Refused {
        int count = in.readSInt32();
        if (count < 0 || count > MAX_INDEXES) {
            throw new Refused("value does not decode as Protobuf with schema id " + writer.id + ": " + count
                    + " message indexes");
        }
        List<Descriptor> level = writer.file.getMessageTypes();
        Descriptor found = null;
        StringBuilder path = new StringBuilder();
        for (int i = 0; i < Math.max(count, 1); i++) {
            int index = count == 0 ? 0 : in.readSInt32();
            path.append(i == 0 ? "" : ",").append(index);
            if (index < 0 || index >= level.size()) {
                throw new Refused("message index [" + path + "] is not a message of schema id " + writer.id);
            }
            found = level.get(index);
            level = found.getNestedTypes();
        }
        return found;
    }

    private static void read(DynamicMessage parsed, Resolution resolution, Object[] into) throws Refused {
        for (int i = 0; i < resolution.readerFields.length; i++) {
            FieldDescriptor field = resolution.readerFields[i];
            FieldDescriptor written = resolution.writerFields[i];
            Object raw;
            FieldDescriptor source;
            if (written == null) {  // the writer's version has no such field: the reader's default
                if (field.isRepeated()) {
                    raw = List.of();
                } else if (field.hasPresence()) {
                    continue;
                } else {
                    raw = field.getDefaultValue();
                }
                source = field;
            } else if (!written.isRepeated() && written.hasPresence() && !parsed.hasField(written)) {
                continue;
            } else {
                raw = parsed.getField(written);
                source = written;
            }
            into[i] = value(raw, source, resolution.types[i], resolution.nested[i], field);
        }
    }

    private static Object value(Object raw, FieldDescriptor source, DataType type, Resolution nested,
                                FieldDescriptor field) throws Refused {
        if (source.isMapField()) {
            List<?> entries = (List<?>) raw;
            Object[] keys = new Object[entries.size()];
            Object[] values = new Object[entries.size()];
            for (int j = 0; j < entries.size(); j++) {
                Object[] pair = new Object[2];
                read((DynamicMessage) entries.get(j), nested, pair);
                keys[j] = pair[0];
                values[j] = pair[1];
            }
            return new ArrayBasedMapData(new GenericArrayData(keys), new GenericArrayData(values));
        }
        if (source.isRepeated()) {
            List<?> items = (List<?>) raw;
            DataType element = ((ArrayType) type).elementType();
            Object[] out = new Object[items.size()];
            for (int j = 0; j < items.size(); j++) {
                out[j] = scalar(items.get(j), source, element, nested, field);
            }
            return new GenericArrayData(out);
        }
        return scalar(raw, source, type, nested, field);
    }

    private static Object scalar(Object raw, FieldDescriptor source, DataType type, Resolution nested,
                                 FieldDescriptor field) throws Refused {
        FieldDescriptor.Type kind = source.getType();
        if (type instanceof StructType) {
            Object[] values = new Object[((StructType) type).fields().length];
            read((DynamicMessage) raw, nested, values);
            return new GenericInternalRow(values);
        }
        if (type instanceof TimestampType && raw instanceof DynamicMessage stamp) {  // google.protobuf.Timestamp
            Descriptor d = stamp.getDescriptorForType();
            long seconds = (Long) stamp.getField(d.findFieldByNumber(1));
            int nanos = (Integer) stamp.getField(d.findFieldByNumber(2));
            return Math.addExact(Math.multiplyExact(seconds, 1_000_000L), nanos / 1_000);
        }
        if (type instanceof StringType) {
            if (raw instanceof EnumValueDescriptor value) {
                return UTF8String.fromString(value.getName());
            }
            if (raw instanceof String text) {
                return UTF8String.fromString(text);
            }
        } else if (type instanceof LongType && raw instanceof Number number) {
            boolean unsigned = kind == FieldDescriptor.Type.UINT32 || kind == FieldDescriptor.Type.FIXED32;
            return unsigned ? Integer.toUnsignedLong(number.intValue()) : number.longValue();
        } else if (type instanceof IntegerType && raw instanceof Integer number) {
            return number;
        } else if (type instanceof DoubleType && raw instanceof Number number
                && (raw instanceof Double || raw instanceof Float)) {
            return number.doubleValue();
        } else if (type instanceof FloatType && raw instanceof Float number) {
            return number;
        } else if (type instanceof BooleanType && raw instanceof Boolean flag) {
            return flag;
        } else if (type instanceof BinaryType && raw instanceof ByteString bytes) {
            return bytes.toByteArray();
        }
        throw new Refused("field " + field.getName() + " is " + kind(source) + " in the writer's schema, which does "
                + "not read as the column's " + type.simpleString());
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

    @Override
    public Expression withNewChildrenInternal(scala.collection.immutable.IndexedSeq<Expression> children) {
        return new ProtobufFromBytes(children.apply(0), writers, message, reader, subject, schema);
    }

    @Override
    String name() {
        return NAME;
    }

    @Override
    Object[] fields() {
        return new Object[] {child, writers, message, reader, subject, schema};
    }
}
