package io.tidemark.s3server;

import java.io.FileInputStream;
import java.io.InputStream;
import java.util.Properties;
import org.gaul.s3proxy.PutOptions2;
import org.gaul.s3proxy.S3Proxy;
import org.jclouds.ContextBuilder;
import org.jclouds.blobstore.BlobStore;
import org.jclouds.blobstore.BlobStoreContext;
import org.jclouds.blobstore.domain.Blob;
import org.jclouds.blobstore.options.PutOptions;
import org.jclouds.blobstore.util.ForwardingBlobStore;
import org.jclouds.http.HttpResponse;
import org.jclouds.http.HttpResponseException;

/**
 * s3proxy over a local directory, with {@code PUT If-None-Match: *} atomic as S3 makes it.
 *
 * s3proxy answers the condition by asking the store whether the key exists, then storing the
 * body: two conditional PUTs of one key that overlap both pass the check and both get 200,
 * the later replacing the earlier (measured: 57 of 150 racing versions). S3 itself decides
 * the condition atomically with the write, and Tidemark's commits rely on exactly that. So
 * this server runs s3proxy's own handler (authentication, the S3 API) over its filesystem
 * store wrapped so that a conditional create checks and stores under a lock on the key:
 * within this one server process, of overlapping creates of one key exactly one succeeds
 * and the others get 412. Everything else is s3proxy's, unchanged.
 *
 * Usage: {@code java -cp s3proxy.jar:this.jar io.tidemark.s3server.ExclusiveCreateS3Proxy FILE}
 * with s3proxy's properties file (s3proxy.*, jclouds.provider=filesystem, its basedir).
 */
public final class ExclusiveCreateS3Proxy {

    private ExclusiveCreateS3Proxy() {
    }

    /** The filesystem store, with conditional creates exclusive per key. */
    static final class ExclusiveCreates extends ForwardingBlobStore {
        private final Object[] stripes = new Object[256];

        ExclusiveCreates(BlobStore delegate) {
            super(delegate);
            for (int i = 0; i < stripes.length; i++) {
                stripes[i] = new Object();
            }
        }

        @Override
        public String putBlob(String container, Blob blob, PutOptions options) {
            if (!(options instanceof PutOptions2) || !"*".equals(((PutOptions2) options).getIfNoneMatch())) {
                return super.putBlob(container, blob, options);
            }
            String name = blob.getMetadata().getName();
            Object lock = stripes[Math.floorMod((container + "/" + name).hashCode(), stripes.length)];
            synchronized (lock) {
                if (delegate().blobExists(container, name)) {
                    throw new HttpResponseException("the key exists: If-None-Match: * fails", null,
                            HttpResponse.builder().statusCode(412).build());
                }
                return super.putBlob(container, blob, options);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        try (InputStream in = new FileInputStream(args[0])) {
            properties.load(in);
        }
        BlobStoreContext context = ContextBuilder.newBuilder(properties.getProperty("jclouds.provider"))
                .overrides(properties)
                .build(BlobStoreContext.class);
        S3Proxy proxy = S3Proxy.Builder.fromProperties(properties)
                .blobStore(new ExclusiveCreates(context.getBlobStore()))
                .build();
        proxy.start();
        while (!proxy.getState().equals("STARTED")) {
            Thread.sleep(10);
        }
        System.out.println("S3 server started on port " + proxy.getPort());
        Thread.currentThread().join();
    }
}
