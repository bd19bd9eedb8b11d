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
    install_tls_provider();
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

/// Makes ring rustls's process-wide crypto provider unless the program chose one: reqwest is
/// built without a provider of its own (Cargo.toml: one crypto library, not two), and would panic
/// building a client with none. A program that installs its own before opening a remote location
/// keeps it.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // An error means another thread installed one in between; that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// [`Error::Store`](crate::Error::Store) for the object store's error `e` on `location`, with
/// its causes and what to do about it where the store's own words do not say.
pub(crate) fn store_error(location: String, e: object_store::Error) -> crate::Error {
    let error = WithCauses::new(e);
    let hint = match error.error {
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            " (check the credentials and the bucket's access policy: `storage_options` or the AWS_*, GOOGLE_*, AZURE_* environment variables)"
        }
        object_store::Error::NotFound { .. } => " (does the bucket or container exist?)",
        _ if error.certificate_refused => {
            " (the server's TLS certificate was refused: for a private CA, point SSL_CERT_FILE at its certificate; for a test server with a self-signed one you trust, pass the storage option allow_invalid_certificates=true)"
        }
        _ => "",
    };
    crate::Error::Store { location, source: Box::new(error), hint }
}

/// An object store's error whose text carries its causes. reqwest's own words stop at "error
/// sending request"; why (a refused certificate or connection, a name that does not resolve)
/// is only in the errors beneath it, which a message built from `Display` would drop.
#[derive(Debug)]
struct WithCauses {
    text: String,
    error: object_store::Error,
    /// rustls refused the server's certificate (found by type, not by words: a URL may say
    /// "certificate").
    certificate_refused: bool,
}

impl WithCauses {
    fn new(error: object_store::Error) -> WithCauses {
        let mut text = error.to_string();
        let mut certificate_refused = false;
        let mut cause = std::error::Error::source(&error);
        // Bounded: a chain is a few links; a cycle or a very long one is cut.
        for _ in 0..16 {
            let Some(c) = cause else { break };
            certificate_refused |= refused_certificate(c);
            let t = c.to_string();
            if !t.is_empty() && !text.contains(&t) {
                text.push_str(": ");
                text.push_str(&t);
            }
            cause = c.source();
        }
        WithCauses { text, error, certificate_refused }
    }
}

/// Whether `e` is rustls refusing a certificate. It arrives inside io::Errors (two, nested),
/// whose `source` skips what they wrap; `get_ref` reaches it.
fn refused_certificate(mut e: &(dyn std::error::Error + 'static)) -> bool {
    for _ in 0..8 {
        if let Some(rustls::Error::InvalidCertificate(_)) = e.downcast_ref::<rustls::Error>() {
            return true;
        }
        match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => e = inner,
            None => return false,
        }
    }
    false
}

impl std::fmt::Display for WithCauses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// No source: the text is the whole chain already, and a printer that walks sources (anyhow's
/// `{:#}`) would print it again.
impl std::error::Error for WithCauses {}
