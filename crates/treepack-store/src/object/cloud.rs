//! Object-store clients for remote locations (S3, GCS, Azure, HTTP) and treepack's own tuning
//! options: credentials from each cloud's usual environment variables, overridden by explicit
//! [`StorageOptions`](crate::StorageOptions).

use crate::StorageOptions;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreScheme};
use std::collections::BTreeMap;
use std::sync::Arc;

/// treepack's own storage-option keys (the rest go to the cloud client):
/// `max_concurrency` (requests in flight per operation, default 16), `multipart_threshold`
/// (objects at least this large are uploaded in parts, default 64 MiB), `multipart_part_size`
/// (default 16 MiB), `max_request_bytes` (largest coalesced ranged read, default 32 MiB),
/// `max_retries` (per request, default 10) and `retry_timeout_secs` (give up retrying a request
/// after this long, default 180). Retries back off exponentially from 100 ms up to 15 s.
pub const TUNING_KEYS: [&str; 6] = [
    "max_concurrency",
    "multipart_threshold",
    "multipart_part_size",
    "max_request_bytes",
    "max_retries",
    "retry_timeout_secs",
];

/// How requests to a remote store are shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteTuning {
    /// Requests in flight at once per operation (1 to 1024).
    pub max_concurrency: usize,
    /// Objects of at least this many bytes are uploaded in parts.
    pub multipart_threshold: u64,
    /// Size of each part of a multipart upload, in bytes (5 MiB to 5 GiB).
    pub multipart_part_size: usize,
    /// Largest ranged read that nearby chunk reads are coalesced into, in bytes.
    pub max_request_bytes: u64,
}

impl Default for RemoteTuning {
    fn default() -> Self {
        RemoteTuning {
            max_concurrency: 16,
            multipart_threshold: 64 << 20,
            multipart_part_size: 16 << 20,
            max_request_bytes: 32 << 20,
        }
    }
}

/// Build the object_store client for a remote URL: `(store, prefix, read_only, tuning)`.
/// Errors are plain reasons; the caller wraps them in [`Error::BadLocation`].
pub(super) fn remote_store(
    s: &str,
    options: &StorageOptions,
) -> std::result::Result<(Arc<dyn ObjectStore>, ObjPath, bool, RemoteTuning), String> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    use object_store::http::HttpBuilder;
    use object_store::{ClientConfigKey, ClientOptions, RetryConfig};

    let url = url::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    let (scheme, prefix) = ObjectStoreScheme::parse(&url).map_err(|_| {
        format!(
            "scheme `{}://` is not supported (supported: local paths, file://, memory://, s3://, gs://, az://, abfs://, http(s)://)",
            url.scheme()
        )
    })?;
    let mut tuning = RemoteTuning::default();
    let mut retry = RetryConfig::default();
    let mut client = BTreeMap::new();
    for (k, v) in options {
        let num =
            || v.trim().parse::<u64>().map_err(|_| format!("storage option `{k}` must be a whole number, got `{v}`"));
        match k.as_str() {
            "max_concurrency" => tuning.max_concurrency = num()?.clamp(1, 1024) as usize,
            "multipart_threshold" => tuning.multipart_threshold = num()?,
            "multipart_part_size" => tuning.multipart_part_size = num()?.clamp(5 << 20, 5 << 30) as usize,
            "max_request_bytes" => tuning.max_request_bytes = num()?.max(1),
            "max_retries" => retry.max_retries = num()?.min(1000) as usize,
            "retry_timeout_secs" => retry.retry_timeout = std::time::Duration::from_secs(num()?),
            _ => {
                client.insert(k.to_ascii_lowercase(), v.clone());
            }
        }
    }
    // Plain-HTTP endpoints are how people reach MinIO, moto or azurite; asking for one is consent.
    let http_endpoint = client.iter().any(|(k, v)| k.contains("endpoint") && v.starts_with("http://"))
        || std::env::var("AWS_ENDPOINT_URL").is_ok_and(|v| v.starts_with("http://"))
        || std::env::var("AWS_ENDPOINT").is_ok_and(|v| v.starts_with("http://"));
    let client_options = ClientOptions::new().with_allow_http(http_endpoint || url.scheme() == "http");
    let unknown = |k: &str, cloud: &str| {
        format!(
            "unknown storage option `{k}` for {cloud} (see object_store's {cloud} config keys, or treepack's: {})",
            TUNING_KEYS.join(", ")
        )
    };
    // Each cloud's builder takes the same steps; only its types differ.
    macro_rules! build {
        ($builder:expr, $key:ty, $cloud:literal) => {{
            let mut b = $builder.with_client_options(client_options).with_retry(retry);
            for (k, v) in &client {
                let key: $key = k.parse().map_err(|_| unknown(k, $cloud))?;
                b = b.with_config(key, v);
            }
            let store: Arc<dyn ObjectStore> = Arc::new(b.build().map_err(|e| format!("{} client: {e}", $cloud))?);
            store
        }};
    }
    let (store, read_only) = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            (build!(AmazonS3Builder::from_env().with_url(s), AmazonS3ConfigKey, "S3"), false)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            (build!(GoogleCloudStorageBuilder::from_env().with_url(s), GoogleConfigKey, "GCS"), false)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            (build!(MicrosoftAzureBuilder::from_env().with_url(s), AzureConfigKey, "Azure"), false)
        }
        ObjectStoreScheme::Http => {
            let origin = &url[..url::Position::BeforePath];
            (build!(HttpBuilder::new().with_url(origin), ClientConfigKey, "HTTP"), true)
        }
        other => return Err(format!("{other:?} locations are not remote; use a plain path or memory://")),
    };
    Ok((store, prefix, read_only, tuning))
}

/// [`Error::Store`](crate::Error::Store) for the object store's error `e` on `location`, with
/// what to do about it where the store's own words do not say.
pub(crate) fn store_error(location: String, e: object_store::Error) -> crate::Error {
    let hint = match e {
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            " (check the credentials and the bucket's access policy: `storage_options` or the AWS_*, GOOGLE_*, AZURE_* environment variables)"
        }
        object_store::Error::NotFound { .. } => " (does the bucket or container exist?)",
        _ => "",
    };
    crate::Error::Store { location, source: Box::new(e), hint }
}
