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
import com.google.protobuf.InvalidProtocolBufferException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
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
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;

/**
 * {@code format: protobuf}'s decode: a Confluent-framed Protobuf value (magic byte 0, the
 * writer schema's 4-byte id, the message indexes, the body) read with its <em>writer's</em>
 * descriptor straight from the wire into the pipeline's reader message, field by field
 * <em>number</em>, as Protobuf itself resolves versions: a field the writer lacks takes the
 * reader's default (null where the field has presence), a field the reader lacks is skipped,
 * an int32 read as an int64 widens, an enum reads as its value's name. As Protobuf's parsers
 * do: the last of a singular field seen twice wins, a message seen twice is merged, a
 * repeated scalar may come packed or not.
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
 * descriptor per column where a topic's records carry several writer versions. Why from the
 * wire and not through protobuf-java's {@code DynamicMessage}: that builds a map of boxed
 * values per record and ran at under half the Avro decode's rate (1M records of 20 fields,
 * docs/benchmarks.md); this reads each field once into the row.
 */
public final class ProtobufFromBytes extends FramedDecoder {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_from_protobuf";
    /** At most this many message indexes in a frame: a nesting deeper than any real schema's. */
    private static final int MAX_INDEXES = 64;
    /** Messages nested deeper than this in a value are refused (Protobuf's own parsers stop at 100). */
    private static final int MAX_DEPTH = 100;

    private final MapData writers;
    private final String message;
    private final int reader;
    private final String subject;
    private transient Map<Integer, Writer> decoders;

    public ProtobufFromBytes(Expression child, MapData writers, String message, int reader, String subject,
                             StructType schema) {
        super(child, schema);
        this.writers = writers;
        this.message = message;
        this.reader = reader;
        this.subject = subject;
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
            String usage = NAME + "(value, writers, message, reader, subject, schema)";
            check(args, 6, usage);
            StructType schema = struct(args.apply(5), usage);
            return new ProtobufFromBytes(args.apply(0), (MapData) args.apply(1).eval(null),
                    String.valueOf(args.apply(2).eval(null)), ((Number) args.apply(3).eval(null)).intValue(),
                    String.valueOf(args.apply(4).eval(null)), schema);
        }
    }

    /** One writer version: its file and, per message it holds, how to read it into the reader's. */
    private static final class Writer {
        final int id;
        final FileDescriptor file;
        /** Per message: its {@link Plan}, or the {@link Refused} that every value of it gets. */
        final Map<Descriptor, Object> plans = new HashMap<>();

        Writer(int id, FileDescriptor file) {
            this.id = id;
            this.file = file;
        }
    }

    /** How a writer's message is read into a reader's: per field number on the wire, its column. */
    private static final class Plan {
        final Slot[] byNumber;
        final Map<Integer, Slot> sparse;
        /** Per reader column, its slot (whose writer field is null where the writer lacks it). */
        final Slot[] columns;

        Plan(Descriptor writer, Descriptor reader, StructType type, int depth) throws Refused {
            if (depth > MAX_DEPTH) {
                throw new Refused("message " + reader.getFullName() + " nests deeper than " + MAX_DEPTH + " levels");
            }
            List<FieldDescriptor> fields = reader.getFields();
            if (fields.size() != type.fields().length) {
                throw new Refused("the reader schema of message " + reader.getFullName() + " does not match its columns");
            }
            columns = new Slot[fields.size()];
            Map<Integer, Slot> found = new HashMap<>();
            int top = 0;
            for (int i = 0; i < columns.length; i++) {
                FieldDescriptor field = fields.get(i);
                FieldDescriptor written = writer.findFieldByNumber(field.getNumber());
                columns[i] = new Slot(i, field, written, type.fields()[i].dataType(), depth);
                if (written != null) {
                    found.put(written.getNumber(), columns[i]);
                    top = Math.max(top, written.getNumber());
                }
            }
            if (top < 1024) {
                byNumber = new Slot[top + 1];
                found.forEach((number, slot) -> byNumber[number] = slot);
                sparse = null;
            } else {
                byNumber = null;
                sparse = found;
            }
        }

        Slot slot(int number) {
            if (byNumber != null) {
                return number < byNumber.length ? byNumber[number] : null;
            }
            return sparse.get(number);
        }
    }

    /** One reader column and the writer's field of its number. */
    private static final class Slot {
        final int column;
        final FieldDescriptor reader;
        final FieldDescriptor writer;
        /** The column's type; a repeated field's element's; a map's entry (key, value) as a struct. */
        final DataType type;
        final boolean repeated;
        final boolean map;
        final boolean timestamp;
        final Plan nested;

        Slot(int column, FieldDescriptor reader, FieldDescriptor writer, DataType columnType, int depth) throws Refused {
            this.column = column;
            this.reader = reader;
            this.writer = writer;
            this.repeated = reader.isRepeated();
            this.map = reader.isMapField();
            DataType element = columnType;
            if (map) {
                MapType pair = (MapType) columnType;
                element = new StructType(new StructField[] {
                        new StructField("key", pair.keyType(), true, Metadata.empty()),
                        new StructField("value", pair.valueType(), true, Metadata.empty())});
            } else if (repeated) {
                element = ((ArrayType) columnType).elementType();
            }
            this.type = element;
            this.timestamp = element instanceof TimestampType;
            boolean readerMessage = reader.getJavaType() == FieldDescriptor.JavaType.MESSAGE;
            if (writer == null) {  // never on the wire: finish() gives it its default
                this.nested = null;
                return;
            }
            boolean writerMessage = writer.getJavaType() == FieldDescriptor.JavaType.MESSAGE;
            if (readerMessage != writerMessage || reader.isRepeated() != writer.isRepeated()
                    || reader.isMapField() != writer.isMapField()) {
                throw new Refused("field " + reader.getName() + " is " + kind(writer) + " in the writer's schema and "
                        + kind(reader) + " in the reader's");
            }
            if (readerMessage && !timestamp) {
                this.nested = new Plan(writer.getMessageType(), reader.getMessageType(), (StructType) element, depth + 1);
            } else {
                this.nested = null;
                if (!timestamp && !reads(writer.getType(), element)) {
                    throw new Refused("field " + reader.getName() + " is " + kind(writer) + " in the writer's schema, "
                            + "which does not read as the column's " + element.simpleString());
                }
            }
        }
    }

    /** Whether a writer's scalar of this type reads as a column of {@code type}. */
    private static boolean reads(FieldDescriptor.Type kind, DataType type) {
        switch (kind) {
            case INT32: case SINT32: case SFIXED32:
                return type instanceof IntegerType || type instanceof LongType;
            case INT64: case SINT64: case SFIXED64: case UINT32: case FIXED32: case UINT64: case FIXED64:
                return type instanceof LongType;
            case FLOAT:
                return type instanceof FloatType || type instanceof DoubleType;
            case DOUBLE:
                return type instanceof DoubleType;
            case BOOL:
                return type instanceof BooleanType;
            case STRING: case ENUM:
                return type instanceof StringType;
            case BYTES:
                return type instanceof BinaryType;
            default:
                return false;
        }
    }

    private static String kind(FieldDescriptor field) {
        String base = field.getJavaType() == FieldDescriptor.JavaType.MESSAGE
                ? field.getMessageType().getFullName() : field.getType().name().toLowerCase();
        return field.isMapField() ? "a map" : field.isRepeated() ? "repeated " + base : base;
    }

    private Map<Integer, Writer> decoders() {
        if (decoders == null) {
            Map<Integer, Writer> built = new HashMap<>();
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
    InternalRow decode(byte[] value) throws Refused {
        if (value.length < 6 || value[0] != 0) {
            throw new Refused("not Confluent-framed Protobuf: no magic byte 0, 4-byte schema id and message indexes");
        }
        int id = schemaId(value);
        Writer writer = decoders().get(id);
        if (writer == null) {
            throw new Refused("unknown schema id " + Integer.toUnsignedString(id) + " (not a version of subject "
                    + subject + " in the registry)");
        }
        CodedInputStream in = CodedInputStream.newInstance(value, 5, value.length - 5);
        Descriptor written;
        try {
            written = indexed(writer, in);
        } catch (IOException e) {  // a truncated varint of the indexes
            throw new Refused("value does not decode as Protobuf with schema id " + id + ": " + e.getMessage());
        }
        if (!written.getFullName().equals(message)) {
            throw new Refused("schema id " + id + "'s message " + written.getFullName() + " is not the pipeline's "
                    + "message " + message);
        }
        Plan plan = plan(writer, written);
        Object[] values = new Object[schema.fields().length];
        try {
            read(in, plan, values, 0);
        } catch (IOException | RuntimeException e) {  // InvalidProtocolBufferException among them
            throw new Refused("value does not decode as Protobuf with schema id " + id + ": " + e.getMessage());
        }
        finish(plan, values);
        return new GenericInternalRow(values);
    }

    private Plan plan(Writer writer, Descriptor written) throws Refused {
        Object kept = writer.plans.get(written);
        if (kept == null) {
            StructType payload = new StructType(java.util.Arrays.copyOf(schema.fields(), schema.fields().length - 1));
            try {
                kept = new Plan(written, readerMessage(), payload, 0);
            } catch (Refused refused) {
                kept = refused;
            }
            writer.plans.put(written, kept);
        }
        if (kept instanceof Refused refused) {
            throw refused;
        }
        return (Plan) kept;
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

    /**
     * One message's fields from {@code in} (to its end or limit) into {@code into}, by the plan's
     * columns: scalars as the columns' values; repeated fields as lists, map entries as lists of
     * slot pairs and messages as slot arrays, which {@link #finish} turns into Spark's. Unknown
     * fields are skipped.
     */
    private static void read(CodedInputStream in, Plan plan, Object[] into, int depth) throws IOException {
        if (depth > MAX_DEPTH) {
            throw new IOException("messages nest deeper than " + MAX_DEPTH + " levels");
        }
        while (true) {
            int tag = in.readTag();
            if (tag == 0) {
                return;
            }
            int number = tag >>> 3;
            int wire = tag & 7;
            Slot slot = plan.slot(number);
            if (slot == null) {
                if (!in.skipField(tag)) {
                    throw new IOException("an end-group tag outside a group");
                }
                continue;
            }
            FieldDescriptor.Type kind = slot.writer.getType();
            if (slot.repeated && wire == 2 && packable(kind)) {
                int limit = in.pushLimit(in.readRawVarint32());
                while (in.getBytesUntilLimit() > 0) {
                    append(into, slot.column, scalar(in, kind, slot));
                }
                in.popLimit(limit);
                continue;
            }
            if (wire != wireType(kind)) {
                throw new IOException("field " + slot.writer.getName() + " (" + number + ") has wire type " + wire
                        + ", not its schema's " + wireType(kind));
            }
            Object item;
            if (kind == FieldDescriptor.Type.MESSAGE) {
                int limit = in.pushLimit(in.readRawVarint32());
                if (slot.timestamp) {
                    item = timestamp(in);
                } else {
                    Object[] nested = new Object[slot.nested.columns.length];
                    read(in, slot.nested, nested, depth + 1);
                    item = nested;
                }
                in.popLimit(limit);
            } else {
                item = scalar(in, kind, slot);
            }
            if (slot.repeated) {
                append(into, slot.column, item);
            } else if (item instanceof Object[] again && into[slot.column] instanceof Object[] first) {
                merge(first, again);
            } else {
                into[slot.column] = item;
            }
        }
    }

    @SuppressWarnings("unchecked")
    private static void append(Object[] into, int column, Object item) {
        if (!(into[column] instanceof List)) {
            into[column] = new ArrayList<>();
        }
        ((List<Object>) into[column]).add(item);
    }

    /** A message seen again merges into the first: its set fields win, its repeated ones add on. */
    @SuppressWarnings("unchecked")
    private static void merge(Object[] into, Object[] again) {
        for (int i = 0; i < into.length; i++) {
            if (again[i] == null) {
                continue;
            }
            if (into[i] instanceof List && again[i] instanceof List) {
                ((List<Object>) into[i]).addAll((List<Object>) again[i]);
            } else if (into[i] instanceof Object[] a && again[i] instanceof Object[] b) {
                merge(a, b);
            } else {
                into[i] = again[i];
            }
        }
    }

    /** A {@code google.protobuf.Timestamp} as Spark's microseconds. */
    private static Object timestamp(CodedInputStream in) throws IOException {
        long seconds = 0;
        int nanos = 0;
        while (true) {
            int tag = in.readTag();
            if (tag == 0) {
                return Math.addExact(Math.multiplyExact(seconds, 1_000_000L), nanos / 1_000);
            }
            if (tag == (1 << 3)) {
                seconds = in.readInt64();
            } else if (tag == (2 << 3)) {
                nanos = in.readInt32();
            } else if (!in.skipField(tag)) {
                throw new IOException("an end-group tag inside a google.protobuf.Timestamp");
            }
        }
    }

    private static Object scalar(CodedInputStream in, FieldDescriptor.Type kind, Slot slot) throws IOException {
        DataType type = slot.type;
        switch (kind) {
            case INT32: return widen(in.readInt32(), type);
            case SINT32: return widen(in.readSInt32(), type);
            case SFIXED32: return widen(in.readSFixed32(), type);
            case INT64: return in.readInt64();
            case SINT64: return in.readSInt64();
            case SFIXED64: return in.readSFixed64();
            case UINT32: return Integer.toUnsignedLong(in.readUInt32());
            case FIXED32: return Integer.toUnsignedLong(in.readFixed32());
            case UINT64: return in.readUInt64();
            case FIXED64: return in.readFixed64();
            case FLOAT: {
                float number = in.readFloat();
                return type instanceof DoubleType ? (Object) (double) number : (Object) number;
            }
            case DOUBLE: return in.readDouble();
            case BOOL: return in.readBool();
            case STRING: {  // UTF-8, as Protobuf requires of proto3 strings and a string column needs
                byte[] text = in.readByteArray();
                if (!ValidUtf8.isValid(text)) {
                    throw new IOException("field " + slot.writer.getName() + " is not valid UTF-8");
                }
                return UTF8String.fromBytes(text);
            }
            case BYTES: return in.readByteArray();
            case ENUM: {
                int number = in.readEnum();
                EnumValueDescriptor named = slot.writer.getEnumType().findValueByNumber(number);
                return UTF8String.fromString(named != null ? named.getName() : Integer.toString(number));
            }
            default:
                throw new IOException("field " + slot.writer.getName() + " has type " + kind + ", which is not read");
        }
    }

    private static Object widen(int number, DataType type) {
        return type instanceof LongType ? (Object) (long) number : (Object) number;
    }

    private static boolean packable(FieldDescriptor.Type kind) {
        return kind != FieldDescriptor.Type.STRING && kind != FieldDescriptor.Type.BYTES
                && kind != FieldDescriptor.Type.MESSAGE && kind != FieldDescriptor.Type.GROUP;
    }

    private static int wireType(FieldDescriptor.Type kind) {
        switch (kind) {
            case FIXED64: case SFIXED64: case DOUBLE: return 1;
            case STRING: case BYTES: case MESSAGE: return 2;
            case GROUP: return 3;
            case FIXED32: case SFIXED32: case FLOAT: return 5;
            default: return 0;
        }
    }

    /**
     * {@link #read}'s slots as Spark's values: lists as arrays and maps (a key seen again: the
     * last wins), slot arrays as rows, and a field not on the wire as its default: null where it
     * has presence, else the reader's (0, "", the first enum value, an empty list or map).
     */
    @SuppressWarnings("unchecked")
    private static void finish(Plan plan, Object[] values) {
        for (Slot slot : plan.columns) {
            Object held = values[slot.column];
            if (slot.map) {
                Map<Object, Object> entries = new LinkedHashMap<>();
                for (Object entry : held instanceof List ? (List<Object>) held : List.of()) {
                    Object[] pair = (Object[]) entry;
                    finish(slot.nested, pair);
                    entries.put(pair[0], pair[1]);
                }
                values[slot.column] = new ArrayBasedMapData(new GenericArrayData(entries.keySet().toArray()),
                        new GenericArrayData(entries.values().toArray()));
            } else if (slot.repeated) {
                Object[] items = held instanceof List ? ((List<Object>) held).toArray() : new Object[0];
                if (slot.nested != null) {
                    for (int i = 0; i < items.length; i++) {
                        Object[] nested = (Object[]) items[i];
                        finish(slot.nested, nested);
                        items[i] = new GenericInternalRow(nested);
                    }
                }
                values[slot.column] = new GenericArrayData(items);
            } else if (held instanceof Object[] nested) {
                finish(slot.nested, nested);
                values[slot.column] = new GenericInternalRow(nested);
            } else if (held == null && !slot.reader.hasPresence()) {
                values[slot.column] = defaultOf(slot);
            }
        }
    }

    private static Object defaultOf(Slot slot) {
        Object value = slot.reader.getDefaultValue();
        if (value instanceof EnumValueDescriptor named) {
            return UTF8String.fromString(named.getName());
        }
        if (value instanceof String text) {
            return UTF8String.fromString(text);
        }
        if (value instanceof ByteString bytes) {
            return bytes.toByteArray();
        }
        FieldDescriptor.Type kind = slot.reader.getType();
        if (value instanceof Integer number && (kind == FieldDescriptor.Type.UINT32 || kind == FieldDescriptor.Type.FIXED32)) {
            return Integer.toUnsignedLong(number);
        }
        if (value instanceof Integer number && slot.type instanceof LongType) {
            return (long) number;
        }
        if (value instanceof Float number && slot.type instanceof DoubleType) {
            return (double) number;
        }
        return value;
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
