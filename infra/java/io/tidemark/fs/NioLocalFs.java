package io.tidemark.fs;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * Hadoop's local FileContext file system (`fs.AbstractFileSystem.file.impl`) over
 * {@link NioRawLocalFileSystem}: what Delta's log store creates and renames commits with.
 * Hadoop's own (LocalFs over RawLocalFs) builds its RawLocalFileSystem itself; this is the
 * same pair, with the same answers as RawLocalFs, over ours.
 */
public class NioLocalFs extends ChecksumFs {

    public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
        super(new Raw(uri, conf));
    }

    /** RawLocalFs's delegation, to {@link NioRawLocalFileSystem}. */
    static final class Raw extends DelegateToFileSystem {

        Raw(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(uri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;
        }

        @Override
        @Deprecated
        public FsServerDefaults getServerDefaults() throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public FsServerDefaults getServerDefaults(Path f) throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public boolean isValidName(String src) {
            return true;
        }
    }
}
