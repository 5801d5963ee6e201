package io.tidemark.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import io.delta.storage.internal.S3LogStoreUtil;
import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Comparator;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for S3 (s3a:, s3:) whose commits stay exclusive across processes.
 *
 * A Delta commit is the creation of {@code _delta_log/<version>.json}, and it must fail if
 * that file exists: that is how exactly one of two writers wins a version, and every fence
 * Tidemark has (the ledger claim, the target's txnAppId commit, maintenance against
 * ingest) is such a win. Delta's own S3SingleDriverLogStore checks that the key is absent,
 * then writes it, and excludes only writers inside its JVM: two drivers racing one version
 * both "commit", and the later PUT replaces the earlier one's actions.
 *
 * Here each commit file is one PUT with {@code If-None-Match: *} (hadoop-aws's
 * {@code fs.option.create.conditional.overwrite}; plain {@code create(path, false)} does not
 * send it). S3 answers 412 when the key exists, and this store turns that into
 * {@link java.nio.file.FileAlreadyExistsException}, which Delta treats as a conflict: it
 * re-reads the log and retries at the next version, or fails the transaction.
 *
 * A lost reply is not a lost race. If the first PUT stored the object but its reply never
 * arrived, the client's retry of the same PUT is answered 412. So after a 412, or any
 * failure whose outcome is unknown, the store reads the object back: if it holds exactly
 * the bytes this call wrote, the commit is this writer's and the write succeeded. Each
 * commit's content is unique to its writer (its commitInfo carries a fresh txnId and
 * timestamp, its files random names), so it is its own token.
 *
 * S3's 409 ConditionalRequestConflict (two conditional PUTs of one key in flight) is retried
 * a few times. Listing _delta_log from a version uses S3's start-after (delta.enableFastS3AListFrom),
 * so a snapshot update costs the same at 10 versions and at 10,000. That listing sets no
 * delimiter, so it returns the keys of subdirectories as well; only the log's own files are
 * kept, and every other directory is listed one level by the file system. (Taken whole, the
 * deeper keys made VACUUM, which walks a table through listFrom, see the log's commit files
 * as untracked data files of the table and delete them.)
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {

    /** hadoop-aws's option for a PUT with {@code If-None-Match: *}. */
    static final String CONDITIONAL_OVERWRITE = "fs.option.create.conditional.overwrite";
    static final int CONFLICT_RETRIES = 5;

    private final boolean fastListFrom;

    public S3ConditionalLogStore(Configuration hadoopConf) {
        super(hadoopConf);
        this.fastListFrom = hadoopConf.getBoolean("delta.enableFastS3AListFrom", true);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        byte[] body = joined(actions);
        if (overwrite) {  // _last_checkpoint and the like: last writer wins by design
            try (FSDataOutputStream out = fs.create(path, true)) {
                out.write(body);
            }
            return;
        }
        for (int attempt = 1; ; attempt++) {
            try {
                FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path);
                builder.overwrite(false).must(CONDITIONAL_OVERWRITE, true);
                FSDataOutputStream out = builder.build();
                try {
                    out.write(body);
                } finally {
                    out.close();  // the PUT happens here
                }
                return;
            } catch (IOException failed) {
                int status = httpStatus(failed);
                if (status == 409 && attempt < CONFLICT_RETRIES) {
                    pause(attempt);
                    continue;
                }
                Boolean ours = holdsExactly(fs, path, body);
                if (Boolean.TRUE.equals(ours)) {
                    return;  // our PUT landed; its reply, or a retry's 412, said otherwise
                }
                if (Boolean.FALSE.equals(ours)) {
                    throw new java.nio.file.FileAlreadyExistsException(path.toString());
                }
                throw failed;  // nothing there, or unreadable: not committed as far as anyone can tell
            }
        }
    }

    /** TRUE: the object holds exactly {@code body}; FALSE: another writer's; null: absent or unreadable. */
    static Boolean holdsExactly(FileSystem fs, Path path, byte[] body) {
        try {
            FileStatus status = fs.getFileStatus(path);
            if (status.getLen() != body.length) {
                return Boolean.FALSE;
            }
            byte[] found = new byte[body.length];
            try (FSDataInputStream in = fs.open(path)) {
                in.readFully(0, found);
            }
            return Arrays.equals(found, body) ? Boolean.TRUE : Boolean.FALSE;
        } catch (FileNotFoundException absent) {
            return null;
        } catch (IOException unreadable) {
            return null;
        }
    }

    static byte[] joined(Iterator<String> actions) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            byte[] line = (actions.next() + "\n").getBytes(StandardCharsets.UTF_8);
            out.write(line, 0, line.length);
        }
        return out.toByteArray();
    }

    /**
     * The HTTP status of an S3 failure, or -1. Read by reflection from the cause chain (the AWS
     * SDK's {@code statusCode()}, S3A's own exceptions' {@code statusCode()}), so this class needs
     * only Hadoop's public API to compile and loads without hadoop-aws on other file systems.
     */
    static int httpStatus(Throwable t) {
        for (Throwable e = t; e != null; e = e.getCause()) {
            for (String name : new String[] {"statusCode", "getStatusCode"}) {
                try {
                    Method m = e.getClass().getMethod(name);
                    Object value = m.invoke(e);
                    if (value instanceof Integer && (Integer) value > 0) {
                        return (Integer) value;
                    }
                } catch (ReflectiveOperationException | RuntimeException ignored) {
                    // not this exception's method
                }
            }
            if (e.getCause() == e) {
                break;
            }
        }
        return -1;
    }

    private static void pause(int attempt) throws InterruptedIOException {
        try {
            Thread.sleep(50L << attempt);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while retrying a conflicting conditional PUT");
        }
    }

    @Override
    public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path parent = path.getParent();
        FileStatus[] statuses;
        if (fastListFrom && "_delta_log".equals(parent.getName()) && fs.getScheme() != null
                && fs.getScheme().startsWith("s3")) {
            if (!fs.exists(parent)) {  // listFrom's contract: a missing directory is FileNotFound
                throw new FileNotFoundException(String.format("No such file or directory: %s", parent));
            }
            // S3's start-after lists every key below the prefix, subdirectories' too (it sets no
            // delimiter); listFrom lists one directory, so only the log's own files are kept.
            Path qualifiedParent = fs.makeQualified(parent);
            statuses = Arrays.stream(S3LogStoreUtil.s3ListFromArray(fs, fs.makeQualified(path), qualifiedParent))
                    .filter(s -> qualifiedParent.equals(s.getPath().getParent()))
                    .toArray(FileStatus[]::new);
        } else {
            // Any other directory (VACUUM walks the table's) is listed one level, directories included.
            statuses = fs.listStatus(parent);
        }
        String start = path.getName();
        return Arrays.stream(statuses)
                .filter(s -> s.getPath().getName().compareTo(start) >= 0)
                .sorted(Comparator.comparing(s -> s.getPath().getName()))
                .iterator();
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;  // a PUT is whole or absent
    }
}
