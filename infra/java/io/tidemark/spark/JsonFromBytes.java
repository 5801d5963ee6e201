package io.tidemark.spark;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.json.CreateJacksonParser;
import org.apache.spark.sql.catalyst.json.JSONOptions;
import org.apache.spark.sql.catalyst.json.JacksonParser;
import org.apache.spark.sql.catalyst.util.FailureSafeParser;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.Iterator;
import scala.collection.immutable.Map;
import scala.collection.immutable.Map$;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;

/**
 * {@code from_json(value, schema, map('mode','PERMISSIVE','columnNameOfCorruptRecord', corrupt))}
 * with the same parser and options (and its results, but for the keys named below), reading
 * the value's UTF-8 bytes instead of chars decoded from them.
 *
 * <p>Spark's {@code from_json} wraps every value in an {@code InputStreamReader}, whose
 * decoder allocates and zeroes an 8 KiB buffer per record and decodes UTF-8 to chars
 * before Jackson sees them: 13 % of a bulk ingest's task time in a profile of 1M x 1 KB
 * records (measured on 2 cores). Here Jackson's byte parser reads the value's bytes. A
 * value that does not start like a JSON text in UTF-8 (a byte order mark, a NUL among
 * its first four bytes, anything but whitespace, an object or an array first), on which
 * Jackson would guess another encoding, takes Spark's path. Values that are not UTF-8 fail
 * here where the reader would substitute U+FFFD; the ingest quarantines those first anyway
 * (tidemark_is_valid_utf8).
 *
 * <p>The answers are {@code from_json}'s except on keys built to defeat Jackson's name
 * tables, where its byte and char parsers guard differently (found by review, each
 * reproduced): hundreds of keys colliding in the char parser's hash make {@code from_json}
 * call the record corrupt while this parses it; keys colliding in the byte parser's hash
 * (529 here) do the opposite; and a key over 50,000 UTF-8 bytes but not chars is corrupt
 * here only. Either way the record lands whole or goes to quarantine whole with its bytes.
 *
 * <p>Most records never reach Jackson: {@link PlainJson} reads an ordinary object in one pass
 * over its bytes and hands back (to the parser above) whatever it cannot be sure of.
 *
 * <p>Registered by infra/udfs.py as {@code tidemark_from_json(value, schema,
 * corrupt_column[, utf8_column])}: the value a string or the Kafka value's bytes (binary:
 * read where they lie in the input row, where {@code cast(value as string)} copies them);
 * the schema as DDL or in Spark's JSON form, naming {@code corrupt_column} as a string field
 * (as from_json's PERMISSIVE mode requires). With {@code utf8_column}, the schema's last
 * field and a boolean, rows that {@link PlainJson} read have it true (their value is strict
 * UTF-8, so the ingest skips its own check) and others null.
 */
public final class JsonFromBytes extends TidemarkExpression {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_from_json";

    private final Expression child;
    private final StructType schema;
    private final String corrupt;
    private final String timeZone;
    /** The schema's last field, a boolean this sets when the value is known to be UTF-8; or null. */
    private final String checked;
    private transient FailureSafeParser<UTF8String> parser;
    private transient PlainJson plain;

    public JsonFromBytes(Expression child, StructType schema, String corrupt, String timeZone, String checked) {
        this.child = child;
        this.schema = schema;
        this.corrupt = corrupt;
        this.timeZone = timeZone;
        this.checked = checked;
    }

    /** Registers the function in {@code spark}'s session (what infra/udfs.py calls through py4j). */
    public static void register(SparkSession spark) {
        register(spark, NAME, JsonFromBytes.class, new Builder());
    }

    private static final class Builder extends AbstractFunction1<Seq<Expression>, Expression>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public Expression apply(Seq<Expression> args) {
            int n = args.size();
            if ((n != 3 && n != 4) || !args.apply(1).foldable() || !args.apply(2).foldable()
                    || (n == 4 && !args.apply(3).foldable())) {
                throw new IllegalArgumentException(NAME + "(value, schema, corrupt_column[, utf8_column]): the schema "
                        + "and the columns must be constant strings");
            }
            String ddl = String.valueOf(args.apply(1).eval(null));
            String corrupt = String.valueOf(args.apply(2).eval(null));
            String checked = n == 4 ? String.valueOf(args.apply(3).eval(null)) : null;
            DataType given = ddl.trim().startsWith("{") ? DataType.fromJson(ddl) : StructType.fromDDL(ddl);
            if (!(given instanceof StructType)) {
                throw new IllegalArgumentException(NAME + ": the schema must be a struct, not " + given.simpleString());
            }
            StructType schema = (StructType) given;
            DataType input = args.apply(0).dataType();
            if (!input.equals(DataTypes.StringType) && !input.equals(DataTypes.BinaryType)) {
                throw new IllegalArgumentException(NAME + ": the value must be a string or binary, not "
                        + input.simpleString());
            }
            boolean named = false;
            for (StructField field : schema.fields()) {
                named |= field.name().equals(corrupt);
            }
            if (!named) {
                throw new IllegalArgumentException(NAME + ": the schema has no field " + corrupt);
            }
            StructField[] fields = schema.fields();
            if (checked != null && (fields.length < 2 || !fields[fields.length - 1].name().equals(checked)
                    || !fields[fields.length - 1].dataType().equals(DataTypes.BooleanType) || checked.equals(corrupt))) {
                throw new IllegalArgumentException(NAME + ": the utf8 column " + checked + " must be the schema's last "
                        + "field, a boolean");
            }
            return new JsonFromBytes(args.apply(0), (StructType) schema.asNullable(), corrupt,
                    SQLConf.get().sessionLocalTimeZone(), checked);
        }
    }

    /** Whether Jackson's byte parser decodes {@code value} as UTF-8 without guessing (see the class doc). */
    static boolean plainUtf8(UTF8String value) {
        int n = value.numBytes();
        if (n == 0) {
            return false;
        }
        int first = value.getByte(0) & 0xFF;
        if (first != '{' && first != '[' && first != ' ' && first != '\t' && first != '\n' && first != '\r') {
            return false;
        }
        for (int i = 1; i < Math.min(4, n); i++) {
            if (value.getByte(i) == 0) {
                return false;
            }
        }
        return true;
    }

    private static final class CreateParser extends AbstractFunction2<JsonFactory, UTF8String, JsonParser> {
        @Override
        public JsonParser apply(JsonFactory factory, UTF8String value) {
            if (!plainUtf8(value)) {
                return CreateJacksonParser.utf8String(factory, value);
            }
            // A stream, not the array: given an array, Spark would cut a string field's non-string
            // value (a number, an object) out of it verbatim, where from_json, given a reader, writes
            // it out again ("-2.5e3" vs "-2500.0"). Jackson reads the stream into a buffer it recycles.
            ByteBuffer bytes = value.getByteBuffer();
            try {
                return factory.createParser(new ByteArrayInputStream(bytes.array(),
                        bytes.arrayOffset() + bytes.position(), bytes.remaining()));
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    private static final class Identity extends AbstractFunction1<UTF8String, UTF8String> {
        @Override
        public UTF8String apply(UTF8String value) {
            return value;
        }
    }

    private FailureSafeParser<UTF8String> parser() {
        if (parser == null) {
            @SuppressWarnings("unchecked")
            Map<String, String> options = (Map<String, String>) (Object) Map$.MODULE$.<String, String>empty()
                    .updated("mode", "PERMISSIVE").updated("columnNameOfCorruptRecord", corrupt);
            JSONOptions parsed = new JSONOptions(options, timeZone, corrupt);
            StructType parsedSchema = parsedSchema();
            StructType actual = new StructType(java.util.Arrays.stream(parsedSchema.fields())
                    .filter(f -> !f.name().equals(corrupt)).toArray(StructField[]::new));
            @SuppressWarnings("unchecked")
            Seq<Filter> noFilters = (Seq<Filter>) (Object) scala.collection.immutable.Nil$.MODULE$;
            JacksonParser raw = new JacksonParser(actual, parsed, false, noFilters);
            CreateParser create = new CreateParser();
            Identity identity = new Identity();
            parser = new FailureSafeParser<>(new AbstractFunction1<UTF8String, scala.collection.Iterable<InternalRow>>() {
                @Override
                public scala.collection.Iterable<InternalRow> apply(UTF8String input) {
                    return raw.parse(input, create, identity);
                }
            }, parsed.parseMode(), parsedSchema, corrupt);
        }
        return parser;
    }

    /** What Spark's parser fills: the schema without the utf8 column. */
    private StructType parsedSchema() {
        if (checked == null) {
            return schema;
        }
        StructField[] fields = schema.fields();
        return new StructType(java.util.Arrays.copyOf(fields, fields.length - 1));
    }

    @Override
    public Object eval(InternalRow row) {
        UTF8String value;
        if (child instanceof BoundReference ref && row instanceof UnsafeRow) {
            // A view of the row's bytes, binary or string alike (a binary's BoundReference copies
            // them): the parse's answer is copied out before the row's buffer is reused.
            if (row.isNullAt(ref.ordinal())) {
                return null;
            }
            value = row.getUTF8String(ref.ordinal());
        } else {
            Object input = child.eval(row);
            if (input == null) {
                return null;
            }
            value = input instanceof byte[] bytes ? UTF8String.fromBytes(bytes) : (UTF8String) input;
        }
        if (plainUtf8(value)) {
            if (plain == null) {
                plain = new PlainJson(schema, corrupt, checked);
            }
            InternalRow parsed = plain.parse(value);
            if (parsed != null) {
                return parsed;
            }
        }
        Iterator<InternalRow> rows = parser().parse(value);
        if (!rows.hasNext()) {
            return null;
        }
        InternalRow answer = rows.next();
        if (checked == null) {
            return answer;
        }
        // Spark's parser leaves the utf8 column out: the row again, one field wider, the column null.
        StructField[] fields = schema.fields();
        Object[] wider = new Object[fields.length];
        for (int i = 0; i < fields.length - 1; i++) {
            wider[i] = answer.isNullAt(i) ? null : answer.get(i, fields[i].dataType());
        }
        return new GenericInternalRow(wider);
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
        return new JsonFromBytes(children.apply(0), schema, corrupt, timeZone, checked);
    }

    @Override
    String name() {
        return NAME;
    }

    @Override
    Object[] fields() {
        return new Object[] {child, schema, corrupt, timeZone, checked};
    }
}
