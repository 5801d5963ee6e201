package io.tidemark.spark;

import java.util.HashSet;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * How many events a relay's tidemark.topic_counts header gives the pipeline's topics, read
 * without from_json and higher-order functions (which Spark evaluates interpreted, the
 * largest per-record cost of G3's column before this).
 *
 * Only the form the relay writes is read here: a compact JSON object whose keys are topic
 * names ([A-Za-z0-9._-]+) in strictly increasing order, each with a non-negative whole
 * number of at most nine digits, and a total that fits an int. Anything else returns -1,
 * and the caller (pipelines/transactions.py) falls back to from_json for that record, so
 * every answer is the one from_json would give. {@link TxnHeaders} reads the header with it.
 *
 * The pipeline's topics are given as "L" + "\u0001"-separated names, or "P" + a regular
 * expression that must match the whole name (Spark's rlike of ^(?:p)$).
 */
final class TopicCount {
    private TopicCount() {
    }

    /** The pipeline's topics, parsed; immutable, so an instance shared by threads stays right. */
    static final class Topics {
        final String spec;
        final Set<String> names = new HashSet<>();
        final Pattern pattern;

        Topics(String spec) {
            this.spec = spec;
            if (spec.startsWith("P")) {
                pattern = Pattern.compile("^(?:" + spec.substring(1) + ")$");
            } else {
                pattern = null;
                for (String name : spec.substring(1).split("\u0001", -1)) {
                    names.add(name);
                }
            }
        }

        boolean mine(String topic) {
            return pattern == null ? names.contains(topic) : pattern.matcher(topic).find();
        }
    }

    private static boolean nameChar(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
            || c == '.' || c == '_' || c == '-';
    }

    /** The sum for the pipeline's topics, or -1 when {@code s} is not in the relay's form. */
    static int count(String s, Topics topics) {
        final int n = s.length();
        if (n < 2 || s.charAt(0) != '{' || s.charAt(n - 1) != '}') {
            return -1;
        }
        if (n == 2) {
            return 0;
        }
        long total = 0;
        String previous = null;
        int i = 1;
        while (true) {
            if (s.charAt(i) != '"') {
                return -1;
            }
            int start = ++i;
            while (i < n && nameChar(s.charAt(i))) {
                i++;
            }
            if (i == start || i + 1 >= n || s.charAt(i) != '"' || s.charAt(i + 1) != ':') {
                return -1;
            }
            String key = s.substring(start, i);
            if (previous != null && previous.compareTo(key) >= 0) {
                return -1; // unsorted or repeated keys: from_json decides
            }
            previous = key;
            i += 2;
            int digits = i;
            long value = 0;
            while (i < n && s.charAt(i) >= '0' && s.charAt(i) <= '9') {
                value = value * 10 + (s.charAt(i) - '0');
                i++;
            }
            int length = i - digits;
            if (length == 0 || length > 9 || (length > 1 && s.charAt(digits) == '0')) {
                return -1;
            }
            if (topics.mine(key)) {
                total += value;
                if (total > Integer.MAX_VALUE) {
                    return -1;
                }
            }
            if (i == n - 1) {
                return (int) total;
            }
            if (s.charAt(i) != ',') {
                return -1;
            }
            i++;
        }
    }
}
