package io.tidemark.fs;

import org.apache.hadoop.fs.LocalFileSystem;

/** Hadoop's checksummed local file system (`fs.file.impl`) over {@link NioRawLocalFileSystem}. */
public class NioLocalFileSystem extends LocalFileSystem {

    public NioLocalFileSystem() {
        super(new NioRawLocalFileSystem());
    }
}
