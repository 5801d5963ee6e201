package io.tidemark.spark;

import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.analysis.TypeCheckResult;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;

/**
 * {@code tidemark_txn_headers(headers, topics, counts_header, fallback, txid, lsn, position, size, source[, event])}:
 * a record's source transaction, and its event id, read from its Kafka headers in one pass.
 *
 * <p>The result is a struct. {@code txn}: the record's {@code _tidemark_txn} as
 * pipelines/transactions.py defines it, a struct of {@code id} (the first {@code lsn} and
 * {@code txid} header values joined as {@code <lsn>/<txid>}), {@code position} and
 * {@code size} (the first values of those headers read as {@code try_cast(... AS INT)} reads
 * text), {@code expected} and {@code released} (false); null unless the id, the position and
 * a size above 0 are all there (the record is then its own transaction). {@code expected} is
 * what {@link TopicCount} reads from the first {@code counts_header} for the pipeline's
 * {@code topics}, or the size without one; when that header is not in the relay's form, the
 * {@code fallback} expression (from_json's answer, built by the caller) is evaluated for the
 * record instead, only then, and a null from it also means the size. Then {@code source}, the
 * first value of that header as text, which the write's guard compares; last {@code event}:
 * the first value of the {@code event} header as text, as
 * {@code pipelines.transactions.header} reads it (null when the argument is not given): a G3
 * pipeline's event id then costs no second look at the headers. Records with no headers give
 * null.
 *
 * <p>The transaction leaves whole: the write's projection copies it as one block, and the
 * guard reads one field of it (measured on 2 cores). Built from the headers' fields
 * in Spark instead, the struct's test was repeated for each field read from it.
 *
 * <p>Why: each header looked up with Spark's own functions ({@code headers.key},
 * {@code array_position}, {@code headers.value}, {@code get}) copies the record's header keys
 * and values into two new arrays, six headers a record, inside a conditional the optimiser
 * does not share work across; and that code, per header, is what the JIT compiles. Here each
 * record's headers are read once, in place, and the id and the numbers leave already made:
 * the row between the read and the write carries one string fewer, and the write stage no
 * longer joins the id or parses the numbers. pipelines/transactions.py builds the same column
 * without it for a session that lacks Tidemark's classes; a test holds the two equal.
 */
public final class TxnHeaders extends TidemarkExpression {
    private static final long serialVersionUID = 1L;
    public static final String NAME = "tidemark_txn_headers";

    private final Expression headers;
    private final Expression fallback;
    private final String spec;
    private final String countsHeader;
    private final String[] names;
    /** The event id's header, or null: read like the others, into the result's last field. */
    private final String eventHeader;
    private final Seq<Expression> arguments;
    private transient volatile Lookup lookup;

    /** The type of the Kafka source's {@code headers} column, which {@link #eval} reads in place. */
    private static final DataType HEADERS = DataTypes.createArrayType(DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("key", DataTypes.StringType, true),
        DataTypes.createStructField("value", DataTypes.BinaryType, true)}));

    /** The type of a target's {@code _tidemark_txn} column, which {@code txn} is. */
    private static final StructType TXN = DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("id", DataTypes.StringType, true),
        DataTypes.createStructField("position", DataTypes.IntegerType, true),
        DataTypes.createStructField("size", DataTypes.IntegerType, true),
        DataTypes.createStructField("expected", DataTypes.IntegerType, true),
        DataTypes.createStructField("released", DataTypes.BooleanType, false)});

    /**
     * The result's fields, in order: {@code txn} (from the headers named {@code txid} to
     * {@code size} and the counts), {@code source} and, when given, {@code event}.
     */
    private static final StructType TYPE = DataTypes.createStructType(new StructField[] {
        DataTypes.createStructField("txn", TXN, true),
        DataTypes.createStructField("source", DataTypes.StringType, true),
        DataTypes.createStructField("event", DataTypes.StringType, true)});

    /**
     * Where each header named by the arguments is in {@link Lookup#keys}: {@code NAMED} of them,
     * then the counts header and the event id's.
     */
    private static final int TXID = 0, LSN = 1, POSITION = 2, SIZE = 3, SOURCE = 4, NAMED = 5, COUNTS = 5, EVENT = 6;

    private static final UTF8String SLASH = UTF8String.fromString("/");

    /** How many answers of {@link TopicCount} a {@link Lookup} keeps before it starts over. */
    static final int REMEMBERED = 1024;

    /** What the constants become on an executor, built once there and never changed. */
    private static final class Lookup {
        /** The headers read, at {@code TXID} to {@code EVENT} (the last only when the event id is a header). */
        final UTF8String[] keys;
        /**
         * Per key length in bytes, which of {@link #keys} have it (null: none). A header's key
         * is then compared with the one or two names of its length, not with all seven: the
         * comparisons were a third of this expression's time in a profile (measured on 2 cores).
         */
        final int[][] byLength;
        final TopicCount.Topics topics;
        /**
         * TopicCount's answer per counts header value in the relay's form. Every event of a
         * source transaction carries the same value, and a relay's transactions repeat a few
         * shapes, so most records find theirs here instead of decoding the header to a Java
         * string and hashing each topic name in it again (about half of this expression's
         * time in a profile, measured on 2 cores). Concurrent because the expression may be
         * shared by a task's threads; bounded.
         */
        final ConcurrentHashMap<UTF8String, Integer> counted = new ConcurrentHashMap<>();

        Lookup(String[] names, String countsHeader, String eventHeader, String spec) {
            keys = new UTF8String[eventHeader == null ? EVENT : EVENT + 1];
            for (int i = 0; i < NAMED; i++) {
                keys[i] = UTF8String.fromString(names[i]);
            }
            keys[COUNTS] = UTF8String.fromString(countsHeader);
            if (eventHeader != null) {
                keys[EVENT] = UTF8String.fromString(eventHeader);
            }
            int longest = 0;
            for (UTF8String key : keys) {
                longest = Math.max(longest, key.numBytes());
            }
            byLength = new int[longest + 1][];
            for (int i = 0; i < keys.length; i++) {
                int[] same = byLength[keys[i].numBytes()];
                int[] grown = same == null ? new int[1] : java.util.Arrays.copyOf(same, same.length + 1);
                grown[grown.length - 1] = i;
                byLength[keys[i].numBytes()] = grown;
            }
            topics = new TopicCount.Topics(spec);
        }
    }

    private TxnHeaders(Seq<Expression> arguments, String spec, String countsHeader, String[] names,
                       String eventHeader) {
        this.arguments = arguments;
        this.headers = arguments.apply(0);
        this.fallback = arguments.apply(3);
        this.spec = spec;
        this.countsHeader = countsHeader;
        this.names = names;
        this.eventHeader = eventHeader;
    }

    public static void register(SparkSession spark) {
        register(spark, NAME, TxnHeaders.class, new Builder());
    }

    private static final class Builder extends AbstractFunction1<Seq<Expression>, Expression>
            implements java.io.Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public Expression apply(Seq<Expression> args) {
            int n = args.size();
            if (n != 4 + NAMED && n != 5 + NAMED) {
                throw new IllegalArgumentException(NAME + "(headers, topics, counts_header, fallback, txid, lsn, "
                    + "position, size, source[, event]): " + (4 + NAMED) + " or " + (5 + NAMED) + " arguments, "
                    + "all but the headers and the fallback constants");
            }
            String[] constants = new String[n];
            for (int i = 1; i < n; i++) {
                if (i == 3) {
                    continue;
                }
                Expression arg = args.apply(i);
                Object value = arg.foldable() ? arg.eval(null) : null;
                if (value == null) {
                    throw new IllegalArgumentException(NAME + ": argument " + (i + 1) + " must be a constant string");
                }
                constants[i] = value.toString();
            }
            return new TxnHeaders(args, constants[1], constants[2], java.util.Arrays.copyOfRange(constants, 4, 4 + NAMED),
                                  n > 4 + NAMED ? constants[4 + NAMED] : null);
        }
    }

    @Override
    public Object eval(InternalRow row) {
        Object input = headers.eval(row);
        if (input == null) {
            return null;
        }
        ArrayData array = (ArrayData) input;
        int n = array.numElements();
        if (n == 0) {
            return null;
        }
        Lookup found = lookup;
        if (found == null) {
            found = new Lookup(names, countsHeader, eventHeader, spec);
            lookup = found;
        }
        UTF8String[] keys = found.keys;
        int[][] byLength = found.byLength;
        UTF8String[] values = new UTF8String[EVENT + 1];
        boolean[] seen = new boolean[EVENT + 1];
        int missing = keys.length;
        for (int i = 0; i < n && missing > 0; i++) {
            if (array.isNullAt(i)) {
                continue;
            }
            InternalRow header = array.getStruct(i, 2);
            if (header.isNullAt(0)) {
                continue;
            }
            UTF8String key = header.getUTF8String(0);
            int length = key.numBytes();
            int[] named = length < byLength.length ? byLength[length] : null;
            if (named == null) {
                continue;
            }
            for (int j : named) {  // each name takes its first header, even one another name shares
                if (!seen[j] && keys[j].equals(key)) {
                    seen[j] = true;
                    values[j] = value(header);
                    missing--;
                }
            }
        }
        Object[] result = new Object[] {null, values[SOURCE], values[EVENT]};
        Integer position = integer(values[POSITION]);
        Integer size = integer(values[SIZE]);
        if (values[LSN] == null || values[TXID] == null || position == null || size == null || size <= 0) {
            return new GenericInternalRow(result);  // not a transaction's event: its own
        }
        Object expected = size;
        UTF8String counts = values[COUNTS];
        if (counts != null) {
            Integer known = found.counted.get(counts);
            int counted = known != null ? known : TopicCount.count(counts.toString(), found.topics);
            if (known == null && counted != -1) {
                if (found.counted.size() >= REMEMBERED) {
                    found.counted.clear();
                }
                found.counted.put(counts.copy(), counted);  // a view's bytes change with the next record
            }
            Object read = counted == -1 ? fallback.eval(row) : (Object) counted;
            if (read != null) {
                expected = read;
            }
        }
        result[0] = new GenericInternalRow(new Object[] {
            UTF8String.concat(values[LSN], SLASH, values[TXID]), position, size, expected, false});
        return new GenericInternalRow(result);
    }

    /**
     * A header's value as text (its bytes as they are, as Spark's cast of binary to string), or null.
     *
     * <p>From the Kafka source's rows, a view of the value's bytes where they are, not a copy:
     * a binary and a string field are laid out alike in an {@link UnsafeRow}. Six or seven
     * copies a record otherwise, each a new array. A view is valid while the input row is, as
     * with Spark's own {@code GetStructField}: the result is consumed before the next record,
     * and what {@link Lookup#counted} keeps is copied first.
     */
    private static UTF8String value(InternalRow header) {
        if (header.isNullAt(1)) {
            return null;
        }
        return header instanceof UnsafeRow ? ((UnsafeRow) header).getUTF8String(1)
            : UTF8String.fromBytes(header.getBinary(1));
    }

    /** {@code try_cast(text AS INT)}: Spark's own reading of the text (the one its cast calls), or null. */
    private static Integer integer(UTF8String text) {
        if (text == null) {
            return null;
        }
        try {
            return text.toIntExact();
        } catch (NumberFormatException e) {
            return null;
        }
    }

    @Override
    public TypeCheckResult checkInputDataTypes() {
        if (!HEADERS.sameType(headers.dataType())) {
            return new TypeCheckResult.TypeCheckFailure(NAME + ": the headers must be Kafka's "
                + HEADERS.simpleString() + ", not " + headers.dataType().simpleString());
        }
        if (!fallback.dataType().equals(DataTypes.IntegerType)) {
            return new TypeCheckResult.TypeCheckFailure(NAME + ": the fallback must be an int expression, not "
                + fallback.dataType().simpleString());
        }
        return TypeCheckResult.TypeCheckSuccess$.MODULE$;
    }

    @Override
    public Seq<Expression> children() {
        return arguments;
    }

    @Override
    public DataType dataType() {
        return TYPE;
    }

    @Override
    public boolean nullable() {
        return true;
    }

    @Override
    public Expression withNewChildrenInternal(scala.collection.immutable.IndexedSeq<Expression> children) {
        return new TxnHeaders(children, spec, countsHeader, names, eventHeader);
    }

    @Override
    String name() {
        return NAME;
    }

    @Override
    Object[] fields() {
        return new Object[] {arguments};
    }
}
