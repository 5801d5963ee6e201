package io.tidemark.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A one-pass reader of the JSON objects most topics carry, giving {@link JsonFromBytes} the
 * row {@code from_json} would, or {@code null} when it cannot be sure (the caller then asks
 * Spark's own parser).
 *
 * <p>Why: through Jackson and Spark's {@code JacksonParser}, every string is decoded from
 * UTF-8 to chars, made a {@code String}, and encoded back to UTF-8 for its {@code UTF8String};
 * every field is found through a converter per token. A bulk ingest of 1 KB records spent
 * 16 % of its CPU there (measured on 2 cores). Here the value's bytes are read
 * once: a string without escapes becomes a view of them, a number is parsed from its digits.
 *
 * <p>It answers only for what it reads exactly as {@code from_json} (PERMISSIVE, Spark's
 * default JSON options) does, and returns {@code null} for everything else, which is then
 * Spark's to decide: a root that is not an object; anything after it but whitespace; a
 * duplicate key, or one that names a field in other letter case, or has an escape, or is
 * over 1,000 bytes; more than 256 keys; nesting deeper than 64; any syntax Jackson would
 * reject or accept only by Spark's lenient options (single quotes, NaN, leading zeros,
 * control characters in strings, unknown escapes); a value of another JSON type than its
 * field's (a number for a string, a string for a number, a fraction for an integer); an
 * integer out of its field's range; a lone surrogate escape; bytes that are not strict
 * UTF-8; a field of a type not read here (anything but string, bigint, int, double,
 * boolean, arrays and structs of them) when the record has it. Two details it matches
 * deliberately: a double field given the integer {@code -0} is {@code 0.0} (Jackson reads an
 * integer token as an integer first), and unknown keys' values are checked as strictly as
 * known ones. {@code tests/integration/test_spark_functions.py} holds the answers to
 * {@code from_json}'s on edge and random values, and checks that ordinary records are read
 * here rather than handed back.
 */
public final class PlainJson {
    private static final int STRING = 0, LONG = 1, INT = 2, DOUBLE = 3, BOOLEAN = 4, ARRAY = 5, STRUCT = 6,
            OTHER = 7;
    private static final int MAX_DEPTH = 64, MAX_KEYS = 256, MAX_KEY_BYTES = 1000, MAX_NUMBER_CHARS = 100,
            MAX_STRING_BYTES = 1_000_000;

    /** Thrown to hand a record back to Spark's parser; without a stack, it costs no more than a return. */
    private static final class Unsure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Unsure() {
            super(null, null, false, false);
        }
    }

    private static final Unsure UNSURE = new Unsure();

    /** How to read a value of one Spark type. */
    private static final class Reader {
        final int kind;
        final Reader element; // ARRAY
        final Fields fields; // STRUCT

        Reader(DataType type) {
            if (DataTypes.StringType.equals(type)) { // not a collated string: Spark compares those its own way
                kind = STRING;
            } else if (type instanceof LongType) {
                kind = LONG;
            } else if (type instanceof IntegerType) {
                kind = INT;
            } else if (type instanceof DoubleType) {
                kind = DOUBLE;
            } else if (type instanceof BooleanType) {
                kind = BOOLEAN;
            } else if (type instanceof ArrayType) {
                kind = ARRAY;
                element = new Reader(((ArrayType) type).elementType());
                fields = null;
                return;
            } else if (type instanceof StructType) {
                kind = STRUCT;
                element = null;
                fields = new Fields((StructType) type);
                return;
            } else {
                kind = OTHER;
            }
            element = null;
            fields = null;
        }
    }

    /** A struct's fields: names as UTF-8, readers, and where each goes in the row. */
    private static final class Fields {
        final byte[][] names;
        final String[] lowered;
        final Reader[] readers;
        final int[] slots;
        final int width;

        /** {@code skipped}: fields of the row that the JSON never fills (the corrupt record column, the utf8 one). */
        Fields(StructType type, String... skipped) {
            StructField[] all = type.fields();
            java.util.Set<String> left = new java.util.HashSet<>(java.util.Arrays.asList(skipped));
            int n = 0;
            for (StructField f : all) {
                if (!left.contains(f.name())) {
                    n++;
                }
            }
            names = new byte[n][];
            lowered = new String[n];
            readers = new Reader[n];
            slots = new int[n];
            int k = 0;
            for (int i = 0; i < all.length; i++) {
                if (left.contains(all[i].name())) {
                    continue;
                }
                names[k] = all[i].name().getBytes(StandardCharsets.UTF_8);
                lowered[k] = all[i].name().toLowerCase(java.util.Locale.ROOT);
                readers[k] = new Reader(all[i].dataType());
                slots[k] = i;
                k++;
            }
            width = all.length;
        }
    }

    private final Fields root;
    private final int checked;

    private static final org.slf4j.Logger LOG = org.slf4j.LoggerFactory.getLogger(PlainJson.class);
    private static final java.util.concurrent.atomic.AtomicLong UNFORESEEN = new java.util.concurrent.atomic.AtomicLong();

    /** How many records this JVM's readers handed back on a failure they did not foresee (for tests, through py4j). */
    public static long unforeseen() {
        return UNFORESEEN.get();
    }

    /**
     * For rows of {@code schema}, whose field {@code corrupt} (the corrupt record column) stays
     * null, and whose last field {@code checked}, when not null, is true in every row read here:
     * reading strings strictly and everything else as ASCII, a value read here is UTF-8.
     */
    PlainJson(StructType schema, String corrupt, String checked) {
        root = checked == null ? new Fields(schema, corrupt) : new Fields(schema, corrupt, checked);
        this.checked = checked == null ? -1 : schema.fields().length - 1;
    }

    /** Whether this reader answers for {@code value} itself, under the schema {@code ddl} (for tests, through py4j). */
    public static boolean answers(String ddl, String corrupt, byte[] value) {
        return new PlainJson(StructType.fromDDL(ddl), corrupt, null).parse(UTF8String.fromBytes(value)) != null;
    }

    /** The row {@code from_json} gives for this UTF-8 text, or {@code null} when Spark's parser must decide. */
    InternalRow parse(UTF8String value) {
        // The bytes where they lie (often inside the input row's buffer: no copy of the value per
        // record, measured on 2 cores), else a copy. The bytes after the value may be
        // another field's, so no read goes past `end`: the cursor reads through `peek`, which
        // gives a NUL byte there, and a NUL is no part of any JSON token (a number, a literal or
        // a string cut short at `end` is unsure, never completed by its neighbour's bytes).
        Object base = value.getBaseObject();
        byte[] bytes;
        int from;
        if (base instanceof byte[] array) {
            bytes = array;
            from = Math.toIntExact(value.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET);
        } else {
            bytes = value.getBytes();
            from = 0;
        }
        try {
            Cursor c = new Cursor(bytes, from, from + value.numBytes());
            c.space();
            if (c.peek(c.at) != '{') {
                return null;
            }
            InternalRow row = c.object(root, 0);
            c.space();
            if (c.at != c.end) {
                return null;
            }
            if (checked >= 0) {
                row.setBoolean(checked, true);
            }
            return row;
        } catch (Unsure e) {
            return null;
        } catch (RuntimeException e) {
            // A failure this reader did not foresee (none known): Spark's parser decides, as for
            // any record handed back, rather than the task failing on it at every retry. The
            // first in a JVM is logged, so that it is seen; all are counted, for the tests, which
            // hold the count at zero.
            if (UNFORESEEN.incrementAndGet() == 1) {
                LOG.warn("tidemark_from_json's own reader failed on a record and handed it to Spark's parser; "
                        + "please report this with the stack trace", e);
            }
            return null;
        }
    }

    /**
     * One record's reading position. Every read of a byte goes through {@link #peek}, or lies
     * inside bytes already read through it: a key ({@code same}), a number ({@code digitsOf},
     * {@code exactly}, {@code ascii}), a string ({@code utf8}, {@code escaped}'s copies), a
     * non-ASCII character's first byte ({@code utf8Char}). {@code string}'s eight-byte steps
     * check {@code end} themselves.
     */
    private static final class Cursor {
        final byte[] b;
        final int end;
        int at;
        int keys;

        /** Over {@code bytes[from, to)}. */
        Cursor(byte[] bytes, int from, int to) {
            b = bytes;
            at = from;
            end = to;
        }

        /** The byte at {@code i}, or NUL from {@code end} on: every check of a token's bytes rejects it. */
        byte peek(int i) {
            return i < end ? b[i] : 0;
        }

        void space() {
            while (isSpace(peek(at))) {
                at++;
            }
        }

        void expect(byte x) {
            if (peek(at) != x) {
                throw UNSURE;
            }
            at++;
        }

        /** At '{': the object's fields into a new row of {@code fields}' width. */
        InternalRow object(Fields fields, int depth) {
            if (depth >= MAX_DEPTH) {
                throw UNSURE;
            }
            at++; // '{'
            Object[] out = new Object[fields.width];
            long seen = 0;
            boolean[] seenMore = fields.names.length > 64 ? new boolean[fields.names.length] : null;
            int next = 0; // fields usually come in schema order: try the one after the last first
            space();
            if (peek(at) == '}') {
                at++;
                return new GenericInternalRow(out);
            }
            while (true) {
                if (++keys > MAX_KEYS) {
                    throw UNSURE;
                }
                space();
                expect((byte) '"');
                int start = at;
                while (true) {
                    int x = peek(at);
                    if (x == '"') {
                        break;
                    }
                    if (x == '\\' || (x >= 0 && x < 0x20)) {
                        throw UNSURE; // an escaped key (rare), a control character, or the end
                    }
                    at = x >= 0 ? at + 1 : utf8Char(at);
                }
                int length = at - start;
                if (length > MAX_KEY_BYTES) {
                    throw UNSURE;
                }
                at++;
                int field = find(fields, start, length, next);
                space();
                expect((byte) ':');
                space();
                if (field < 0) {
                    // Jackson's keys are compared by exact name; a key differing only in case is left to Spark.
                    String key = utf8(start, length).toString().toLowerCase(java.util.Locale.ROOT);
                    for (String known : fields.lowered) {
                        if (known.equals(key)) {
                            throw UNSURE;
                        }
                    }
                    skip(depth + 1);
                } else {
                    if (field < 64) {
                        if ((seen & (1L << field)) != 0) {
                            throw UNSURE; // a duplicate key
                        }
                        seen |= 1L << field;
                    } else {
                        if (seenMore[field]) {
                            throw UNSURE;
                        }
                        seenMore[field] = true;
                    }
                    out[fields.slots[field]] = value(fields.readers[field], depth + 1);
                    next = field + 1;
                }
                space();
                byte x = peek(at++);
                if (x == '}') {
                    return new GenericInternalRow(out);
                }
                if (x != ',') {
                    throw UNSURE;
                }
            }
        }

        int find(Fields fields, int start, int length, int next) {
            byte[][] names = fields.names;
            if (next < names.length && same(names[next], start, length)) {
                return next;
            }
            for (int i = 0; i < names.length; i++) {
                if (i != next && same(names[i], start, length)) {
                    return i;
                }
            }
            return -1;
        }

        boolean same(byte[] name, int start, int length) {
            if (name.length != length) {
                return false;
            }
            for (int i = 0; i < length; i++) {
                if (name[i] != b[start + i]) {
                    return false;
                }
            }
            return true;
        }

        /** A value for a field read by {@code reader}; null for JSON null. */
        Object value(Reader reader, int depth) {
            byte x = peek(at);
            if (x == 'n') {
                literal("null");
                return null;
            }
            switch (reader.kind) {
                case STRING:
                    if (x != '"') {
                        throw UNSURE; // Spark writes other JSON out as text; its parser does that
                    }
                    return string();
                case LONG:
                case INT: {
                    int start = at;
                    if (number()) {
                        throw UNSURE; // a fraction or an exponent for an integer field
                    }
                    long v;
                    if (at - start <= 18) { // no overflow in 18 characters
                        v = digitsOf(start, at);
                    } else {
                        try {
                            v = Long.parseLong(ascii(start, at - start));
                        } catch (NumberFormatException e) {
                            throw UNSURE; // out of range
                        }
                    }
                    if (reader.kind == LONG) {
                        return v;
                    }
                    if (v < Integer.MIN_VALUE || v > Integer.MAX_VALUE) {
                        throw UNSURE;
                    }
                    return (int) v;
                }
                case DOUBLE: {
                    int start = at;
                    boolean fraction = number();
                    double v = exactly(start, at);
                    if (Double.isNaN(v)) {
                        v = Double.parseDouble(ascii(start, at - start));
                    }
                    // Jackson reads an integer token as an integer first: "-0" becomes 0, then 0.0.
                    return !fraction && v == 0.0 ? 0.0 : v;
                }
                case BOOLEAN:
                    if (x == 't') {
                        literal("true");
                        return true;
                    }
                    if (x == 'f') {
                        literal("false");
                        return false;
                    }
                    throw UNSURE;
                case ARRAY: {
                    if (x != '[' || depth >= MAX_DEPTH) {
                        throw UNSURE;
                    }
                    at++;
                    java.util.ArrayList<Object> items = new java.util.ArrayList<>();
                    space();
                    if (peek(at) == ']') {
                        at++;
                        return new GenericArrayData(items.toArray());
                    }
                    while (true) {
                        space();
                        items.add(value(reader.element, depth + 1));
                        space();
                        byte y = peek(at++);
                        if (y == ']') {
                            return new GenericArrayData(items.toArray());
                        }
                        if (y != ',') {
                            throw UNSURE;
                        }
                    }
                }
                case STRUCT:
                    if (x != '{') {
                        throw UNSURE;
                    }
                    return object(reader.fields, depth);
                default:
                    throw UNSURE;
            }
        }

        /** Past any JSON value, checking it as strictly as reading it would. */
        void skip(int depth) {
            if (depth >= MAX_DEPTH) {
                throw UNSURE;
            }
            byte x = peek(at);
            switch (x) {
                case '"':
                    string();
                    return;
                case 't':
                    literal("true");
                    return;
                case 'f':
                    literal("false");
                    return;
                case 'n':
                    literal("null");
                    return;
                case '[': {
                    at++;
                    space();
                    if (peek(at) == ']') {
                        at++;
                        return;
                    }
                    while (true) {
                        space();
                        skip(depth + 1);
                        space();
                        byte y = peek(at++);
                        if (y == ']') {
                            return;
                        }
                        if (y != ',') {
                            throw UNSURE;
                        }
                    }
                }
                case '{':
                    object(EMPTY, depth); // every key unknown: values checked, none kept
                    return;
                default:
                    number();
            }
        }

        void literal(String word) {
            for (int i = 0; i < word.length(); i++) {
                if (peek(at + i) != word.charAt(i)) {
                    throw UNSURE;
                }
            }
            at += word.length();
            delimiter();
        }

        /** What may follow a scalar: the end, whitespace, ',', ']' or '}'; anything else is Jackson's to judge. */
        void delimiter() {
            byte x = peek(at);
            if (!(x == ',' || x == '}' || x == ']' || isSpace(x) || at == end)) {
                throw UNSURE;
            }
        }

        /** Past a JSON number (RFC 8259's grammar, no more); whether it has a fraction or an exponent. */
        boolean number() {
            int start = at;
            if (peek(at) == '-') {
                at++;
            }
            byte first = peek(at);
            if (first == '0') {
                at++;
            } else if (first >= '1' && first <= '9') {
                while (isDigit(peek(at))) {
                    at++;
                }
            } else {
                throw UNSURE;
            }
            boolean fraction = false;
            if (peek(at) == '.') {
                fraction = true;
                at++;
                digits();
            }
            byte e = peek(at);
            if (e == 'e' || e == 'E') {
                fraction = true;
                at++;
                byte sign = peek(at);
                if (sign == '+' || sign == '-') {
                    at++;
                }
                digits();
            }
            if (at - start > MAX_NUMBER_CHARS) {
                throw UNSURE;
            }
            delimiter();
            return fraction;
        }

        /** An integer token of at most 18 characters, as a long. */
        long digitsOf(int from, int to) {
            boolean negative = b[from] == '-';
            long v = 0;
            for (int i = negative ? from + 1 : from; i < to; i++) {
                v = v * 10 + (b[i] - '0');
            }
            return negative ? -v : v;
        }

        /**
         * A number token without an exponent and with at most 15 digits, as the double nearest
         * to it, or NaN for any other (the caller then asks Double.parseDouble). Its digits as an
         * integer are below 2^53 and 10^fraction-digits at most 10^15, both exact doubles, so one
         * division rounds once, as the nearest double is defined: Double.parseDouble's answer.
         */
        double exactly(int from, int to) {
            boolean negative = b[from] == '-';
            long digits = 0;
            int count = 0, scale = 0;
            boolean point = false;
            for (int i = negative ? from + 1 : from; i < to; i++) {
                byte x = b[i];
                if (x == '.') {
                    point = true;
                } else if (isDigit(x)) {
                    digits = digits * 10 + (x - '0');
                    count++;
                    if (point) {
                        scale++;
                    }
                } else {
                    return Double.NaN; // an exponent
                }
            }
            if (count > 15) {
                return Double.NaN;
            }
            double v = scale == 0 ? (double) digits : digits / POWERS[scale];
            return negative ? -v : v;
        }

        void digits() {
            if (!isDigit(peek(at))) {
                throw UNSURE;
            }
            while (isDigit(peek(at))) {
                at++;
            }
        }

        static boolean isDigit(byte x) {
            return x >= '0' && x <= '9';
        }

        /** JSON's whitespace (RFC 8259): space, tab, line feed, carriage return. */
        static boolean isSpace(byte x) {
            return x == ' ' || x == '\n' || x == '\r' || x == '\t';
        }

        /** At '"': the string, a view of the bytes when it has no escapes. */
        UTF8String string() {
            int start = ++at;
            while (true) {
                if (at + 8 <= end && plainEight((long) LONGS.get(b, at))) {
                    at += 8;
                    continue;
                }
                int x = peek(at);
                if (x == '"') {
                    break;
                }
                if (x == '\\') {
                    return escaped(start);
                }
                if (x >= 0) {
                    if (x < 0x20) {
                        throw UNSURE; // a control character, or the end
                    }
                    at++;
                } else {
                    at = utf8Char(at);
                }
            }
            int length = at - start;
            at++;
            if (length > MAX_STRING_BYTES) {
                throw UNSURE;
            }
            return utf8(start, length);
        }

        /** A string with escapes, from its start; the cursor is at its first backslash. */
        UTF8String escaped(int start) {
            java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream(Math.max(16, (at - start) * 2));
            out.write(b, start, at - start);
            while (true) {
                int x = peek(at);
                if (x == '"') {
                    at++;
                    break;
                }
                if (x == '\\') {
                    byte e = peek(at + 1);
                    at += 2;
                    switch (e) {
                        case '"': out.write('"'); break;
                        case '\\': out.write('\\'); break;
                        case '/': out.write('/'); break;
                        case 'b': out.write('\b'); break;
                        case 'f': out.write('\f'); break;
                        case 'n': out.write('\n'); break;
                        case 'r': out.write('\r'); break;
                        case 't': out.write('\t'); break;
                        case 'u': {
                            int c = hex4();
                            if (Character.isHighSurrogate((char) c)) {
                                if (peek(at) != '\\' || peek(at + 1) != 'u') {
                                    throw UNSURE; // a lone surrogate
                                }
                                at += 2;
                                int low = hex4();
                                if (!Character.isLowSurrogate((char) low)) {
                                    throw UNSURE;
                                }
                                c = Character.toCodePoint((char) c, (char) low);
                            } else if (Character.isLowSurrogate((char) c)) {
                                throw UNSURE;
                            }
                            byte[] encoded = new String(Character.toChars(c)).getBytes(StandardCharsets.UTF_8);
                            out.write(encoded, 0, encoded.length);
                            break;
                        }
                        default:
                            throw UNSURE;
                    }
                } else if (x >= 0) {
                    if (x < 0x20) {
                        throw UNSURE; // a control character, or the end
                    }
                    out.write(x);
                    at++;
                } else {
                    int from = at;
                    at = utf8Char(at);
                    out.write(b, from, at - from);
                }
                if (out.size() > MAX_STRING_BYTES) {
                    throw UNSURE;
                }
            }
            return UTF8String.fromBytes(out.toByteArray());
        }

        int hex4() {
            int c = 0;
            for (int i = 0; i < 4; i++) {
                int d = Character.digit(peek(at + i), 16);
                if (d < 0) {
                    throw UNSURE;
                }
                c = c * 16 + d;
            }
            at += 4;
            return c;
        }

        /** Past one non-ASCII character at {@code i} (a byte read through peek), strict UTF-8 (as ValidUtf8 reads it). */
        int utf8Char(int i) {
            int c = b[i] & 0xFF;
            if (c < 0xC2) {
                throw UNSURE;
            }
            if (c < 0xE0) {
                cont(i + 1);
                return i + 2;
            }
            if (c < 0xF0) {
                int c1 = peek(i + 1) & 0xFF;
                if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) {
                    throw UNSURE; // overlong, or a surrogate
                }
                cont(i + 1);
                cont(i + 2);
                return i + 3;
            }
            if (c < 0xF5) {
                int c1 = peek(i + 1) & 0xFF;
                if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) {
                    throw UNSURE; // overlong, or above U+10FFFF
                }
                cont(i + 1);
                cont(i + 2);
                cont(i + 3);
                return i + 4;
            }
            throw UNSURE;
        }

        void cont(int i) {
            if ((peek(i) & 0xC0) != 0x80) {
                throw UNSURE;
            }
        }

        UTF8String utf8(int start, int length) {
            return UTF8String.fromBytes(b, start, length);
        }

        String ascii(int start, int length) {
            return new String(b, start, length, StandardCharsets.ISO_8859_1);
        }
    }

    private static final Fields EMPTY = new Fields(new StructType());

    /** 10^0 .. 10^15, each an exact double. */
    private static final double[] POWERS = new double[16];

    static {
        double p = 1;
        for (int i = 0; i < POWERS.length; i++) {
            POWERS[i] = p;
            p *= 10;
        }
    }

    private static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long ONES = 0x0101010101010101L, HIGH = 0x8080808080808080L;

    /** Whether none of eight bytes ends or escapes a string or needs a look: no '"', '\\', control or non-ASCII byte. */
    static boolean plainEight(long w) {
        long quote = w ^ (ONES * '"');
        long backslash = w ^ (ONES * '\\');
        // A byte below 0x20, a zero byte of `quote` or `backslash`: each sets its high bit (and may set more after it).
        long special = ((w - ONES * 0x20) & ~w) | ((quote - ONES) & ~quote) | ((backslash - ONES) & ~backslash);
        return ((special | w) & HIGH) == 0;
    }
}
