package io.tidemark.fs;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.InvalidPathException;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system, with the two calls it makes by starting a process made by java.nio.
 *
 * Without Hadoop's native library (pyspark ships none), RawLocalFileSystem runs `chmod` after
 * creating each file (a Parquet file, a Delta commit, and Hadoop's .crc of each), and its link
 * status runs `readlink` on the path's string, four times per file a Delta commit renames. A
 * follower batch started 26 processes, 4-7 ms of CPU each on 2 cores (measured on 2 cores). Here: the same permission bits set by Files.setPosixFilePermissions, and the
 * same test for a symbolic link (on the same string, so a qualified "file:/..." path is never
 * one, as `readlink` says of it) by Files.isSymbolicLink. Anything else, and every case these
 * two cannot express exactly (sticky or set-id bits, a file system without POSIX attributes, a
 * real symbolic link), is RawLocalFileSystem's own code.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
        if (permission.getStickyBit() || (permission.toShort() & ~0777) != 0) {
            super.setPermission(p, permission);
            return;
        }
        java.nio.file.Path file = pathToFile(p).toPath();
        try {
            Files.setPosixFilePermissions(file, posix(permission));
        } catch (UnsupportedOperationException e) {
            super.setPermission(p, permission);
        } catch (NoSuchFileException e) {
            throw new FileNotFoundException("File " + p + " does not exist");
        }
    }

    @Override
    public FileStatus getFileLinkStatus(Path f) throws IOException {
        if (!namesSymlink(f.toString())) {
            return getFileStatus(f);
        }
        return super.getFileLinkStatus(f);
    }

    /** Whether `readlink` on this string would name a symbolic link's target (a relative string from the working directory). */
    static boolean namesSymlink(String path) {
        try {
            return Files.isSymbolicLink(Paths.get(path));
        } catch (InvalidPathException e) {
            return false;
        }
    }

    static Set<PosixFilePermission> posix(FsPermission permission) {
        Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
        add(bits, permission.getUserAction(), PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE,
            PosixFilePermission.OWNER_EXECUTE);
        add(bits, permission.getGroupAction(), PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE,
            PosixFilePermission.GROUP_EXECUTE);
        add(bits, permission.getOtherAction(), PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE,
            PosixFilePermission.OTHERS_EXECUTE);
        return bits;
    }

    private static void add(Set<PosixFilePermission> bits, FsAction action, PosixFilePermission read,
                            PosixFilePermission write, PosixFilePermission execute) {
        if (action.implies(FsAction.READ)) {
            bits.add(read);
        }
        if (action.implies(FsAction.WRITE)) {
            bits.add(write);
        }
        if (action.implies(FsAction.EXECUTE)) {
            bits.add(execute);
        }
    }
}
