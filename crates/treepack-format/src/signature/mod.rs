//! Signatures over a tree's root hash (docs/format.md section 12, docs/signing.md): a DSSE
//! envelope whose payload is an in-toto Statement v1 about the tree, in a Sigstore bundle as the
//! OpenSSF model-signing tool writes for key pairs.
//!
//! The statement's one subject is the tree, its digest the root hash (section 9) under the key
//! [`ROOT_DIGEST`] — a BLAKE3 Merkle hash over the tree's canonical encoding, not a hash of any
//! file — and its predicate binds the format version, the BLAKE3 of the canonical `metadata`, the
//! time of signing, an optional tree version (a counter the signer raises) and the signer's
//! public key. Everything a verifier checks comes from the manifest, so a signature is checked
//! without reading array data, and it holds for the tree in any layout.
//!
//! Every parser here reads bytes a hostile party may have written: the envelope's size is
//! bounded before parsing ([`MAX_ENVELOPE_BYTES`]), JSON nesting by serde_json's limit (128),
//! signatures by [`MAX_SIGNATURES`], and nothing is trusted until a signature by a key the
//! caller trusts verifies over it.

mod keys;
pub mod time;

pub use keys::{Algorithm, SigningKey, VerifyingKey};

use crate::hash::Hash32;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The DSSE payload type: an in-toto statement in JSON.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate type of a treepack tree signature.
/// An identifier, not a web page (as model-signing's `https://model_signing/signature/v1.0`).
pub const PREDICATE_TYPE: &str = "https://treepack/signature/v1";
/// The predicate type of the OpenSSF model-signing specification 1.0, which a signature with
/// file digests ([`ModelSigning`]) carries, so that its verifier checks the files too.
pub const MODEL_SIGNING_PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// The subject's digest key: the tree's root hash (docs/format.md section 9), BLAKE3-based.
pub const ROOT_DIGEST: &str = "treepackRootBlake3";
/// The media type of the Sigstore bundle around the envelope.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// Largest signature file read (a statement with file digests lists every pack: ~200 bytes each).
pub const MAX_ENVELOPE_BYTES: u64 = 4 << 20;
/// Most signatures one envelope may hold.
pub const MAX_SIGNATURES: usize = 16;

/// The file digests of a signature the model-signing verifier can check (its `files`
/// serialization, SHA-256 per file): the tree's files as they were in one layout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelSigning {
    /// Each file's path relative to the location (`.` for a single file) and SHA-256, sorted by path.
    pub files: Vec<(String, [u8; 32])>,
    /// Paths the model-signing verifier must skip (the signature file itself).
    pub ignore_paths: Vec<String>,
}

/// What a signature states about a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The tree's name as the signer gave it (informational: a copy keeps its signature).
    pub name: String,
    /// The root hash.
    pub root: Hash32,
    /// The manifest's format version.
    pub format_version: (u16, u16),
    /// BLAKE3 of the canonical JSON of the manifest's `metadata` ([`metadata_hash`]); `None`
    /// when the tree has no metadata.
    pub metadata: Option<Hash32>,
    /// When it was signed, in milliseconds since the Unix epoch (whole seconds).
    pub signed_at_ms: u64,
    /// A version number the signer gives its trees (raised with each release), for rollback
    /// checks (`min_version`).
    pub tree_version: Option<u64>,
    /// The public key the signer says it signed with (informational: trust comes from the
    /// caller's keys, never from this one).
    pub signer: Option<VerifyingKey>,
    /// File digests for the model-signing verifier, when the signer asked for them.
    pub model_signing: Option<ModelSigning>,
}

/// BLAKE3 of the canonical JSON of a tree's metadata (members sorted, no whitespace: the
/// encoding of section 9), or `None` without metadata.
pub fn metadata_hash(metadata: Option<&Value>) -> Option<Hash32> {
    metadata.map(|v| {
        let mut s = String::new();
        crate::merkle::value(&mut s, v);
        Hash32::of(s.as_bytes())
    })
}

/// The DSSE pre-authentication encoding that is signed: `DSSEv1 <len> <type> <len> <payload>`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// A signature file, parsed but not yet trusted.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The DSSE payload type.
    pub payload_type: String,
    /// The payload (the statement's JSON bytes).
    pub payload: Vec<u8>,
    /// Each signature: the key id it names (unauthenticated; may be empty) and its bytes.
    pub signatures: Vec<(String, Vec<u8>)>,
    /// The bundle's public-key hint, if it is a bundle with one (unauthenticated).
    pub hint: Option<String>,
}

/// How an envelope's signatures fared against the trusted keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A signature by `trusted[key]` verifies over the payload.
    Verified {
        /// Index of the trusted key.
        key: usize,
    },
    /// None verifies. `claimed`: the key ids the envelope names (unauthenticated);
    /// `names_trusted`: one of them is a trusted key's fingerprint (so its signature was
    /// altered, or the payload was).
    NotVerified {
        /// Key ids named by the envelope and its bundle, deduplicated.
        claimed: Vec<String>,
        /// The trusted key a signature names, if any.
        names_trusted: Option<usize>,
    },
}

#[derive(Deserialize)]
struct RawSig {
    sig: String,
    #[serde(default)]
    keyid: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEnvelope {
    payload: String,
    payload_type: String,
    signatures: Vec<RawSig>,
}

#[derive(Deserialize, Default)]
struct RawKeyId {
    #[serde(default)]
    hint: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawMaterial {
    #[serde(default)]
    public_key: Option<RawKeyId>,
}

/// A Sigstore bundle (its `dsseEnvelope`), or a bare DSSE envelope (its members at the top).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawFile {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    verification_material: Option<RawMaterial>,
    #[serde(default)]
    dsse_envelope: Option<RawEnvelope>,
    #[serde(default)]
    payload: Option<String>,
    #[serde(default)]
    payload_type: Option<String>,
    #[serde(default)]
    signatures: Option<Vec<RawSig>>,
}

/// Base64 as DSSE allows it: the standard or the URL-safe alphabet, padded or not.
fn b64_decode(what: &str, s: &str) -> Result<Vec<u8>, String> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let cfg = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let std = GeneralPurpose::new(&base64::alphabet::STANDARD, cfg);
    let url = GeneralPurpose::new(&base64::alphabet::URL_SAFE, cfg);
    std.decode(s).or_else(|_| url.decode(s)).map_err(|e| format!("{what} is not base64: {e}"))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Parse a signature file: a Sigstore bundle holding a DSSE envelope, or a bare envelope.
///
/// # Errors
/// What is malformed, for a message: size, JSON, base64, the payload type, too many signatures.
pub fn parse(bytes: &[u8]) -> Result<Envelope, String> {
    if bytes.len() as u64 > MAX_ENVELOPE_BYTES {
        return Err(format!("{} bytes, more than the {MAX_ENVELOPE_BYTES} a signature file may have", bytes.len()));
    }
    let raw: RawFile =
        serde_json::from_slice(bytes).map_err(|e| format!("not a DSSE envelope or Sigstore bundle: {e}"))?;
    if let Some(m) = &raw.media_type {
        if !m.starts_with("application/vnd.dev.sigstore.bundle") {
            return Err(format!("a bundle of media type {m:?}, not a Sigstore bundle"));
        }
    }
    let hint = raw.verification_material.and_then(|m| m.public_key).and_then(|k| k.hint).filter(|h| !h.is_empty());
    let env =
        match (raw.dsse_envelope, raw.payload, raw.payload_type, raw.signatures) {
            (Some(e), None, None, None) => e,
            (None, Some(payload), Some(payload_type), Some(signatures)) => {
                RawEnvelope { payload, payload_type, signatures }
            }
            (None, ..) => return Err(
                "neither a DSSE envelope (payload, payloadType, signatures) nor a bundle holding one (dsseEnvelope)"
                    .into(),
            ),
            (Some(_), ..) => return Err("both a dsseEnvelope and envelope members at the top".into()),
        };
    if env.payload_type != PAYLOAD_TYPE {
        return Err(format!("payloadType {:?}, not {PAYLOAD_TYPE:?} (an in-toto statement)", env.payload_type));
    }
    if env.signatures.is_empty() {
        return Err("no signatures".into());
    }
    if env.signatures.len() > MAX_SIGNATURES {
        return Err(format!("{} signatures, more than {MAX_SIGNATURES}", env.signatures.len()));
    }
    let payload = b64_decode("the payload", &env.payload)?;
    let signatures = env
        .signatures
        .into_iter()
        .map(|s| Ok((s.keyid.unwrap_or_default(), b64_decode("a signature", &s.sig)?)))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Envelope { payload_type: env.payload_type, payload, signatures, hint })
}

impl Envelope {
    /// Check the signatures against `trusted` keys.
    pub fn check(&self, trusted: &[VerifyingKey]) -> Check {
        let message = pae(&self.payload_type, &self.payload);
        for (_, sig) in &self.signatures {
            if let Some(key) = trusted.iter().position(|k| k.verify(&message, sig)) {
                return Check::Verified { key };
            }
        }
        let mut claimed: Vec<String> = self
            .signatures
            .iter()
            .map(|(id, _)| id.clone())
            .chain(self.hint.clone())
            .filter(|id| !id.is_empty())
            .collect();
        claimed.dedup();
        let prints: Vec<String> = trusted.iter().map(VerifyingKey::fingerprint).collect();
        let names_trusted = claimed.iter().find_map(|id| prints.iter().position(|p| p == id));
        Check::NotVerified { claimed, names_trusted }
    }

    /// Whether the key the statement embeds signed it (says who signed, for `inspect`; trust
    /// needs the caller's own key, [`Envelope::check`]).
    pub fn self_consistent(&self, claims: &Claims) -> bool {
        claims.signer.as_ref().is_some_and(|k| matches!(self.check(std::slice::from_ref(k)), Check::Verified { .. }))
    }

    /// The statement's claims (unauthenticated until [`Envelope::check`] verified it).
    ///
    /// # Errors
    /// What is wrong with the statement, for a message.
    pub fn claims(&self) -> Result<Claims, String> {
        decode_statement(&self.payload)
    }
}

#[derive(Serialize, Deserialize)]
struct Subject {
    name: String,
    digest: std::collections::BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Signer {
    algorithm: String,
    /// SubjectPublicKeyInfo DER, base64.
    public_key: String,
}

#[derive(Serialize, Deserialize)]
struct Resource {
    algorithm: String,
    digest: String,
    name: String,
}

#[derive(Serialize, Deserialize)]
struct Serialization {
    method: String,
    hash_type: String,
    allow_symlinks: bool,
    ignore_paths: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Predicate {
    format_version: (u16, u16),
    /// Required, `null` when the tree has no metadata: a statement must say.
    #[serde(deserialize_with = "present_or_null")]
    metadata_blake3: Option<String>,
    signed_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tree_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signer: Option<Signer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resources: Option<Vec<Resource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    serialization: Option<Serialization>,
}

fn present_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    type_: String,
    subject: Vec<Subject>,
    predicate_type: String,
    predicate: Predicate,
}

fn hex32(what: &str, s: &str) -> Result<Hash32, String> {
    Hash32::from_hex(s).ok_or_else(|| format!("{what} {s:?} is not 64 lowercase hex digits"))
}

/// The SHA-256 model-signing records as the subject's digest: over the files' digests in order.
fn model_signing_root(files: &[(String, [u8; 32])]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for (_, d) in files {
        h.update(d);
    }
    Hash32(h.finalize().into()).to_hex()
}

/// The statement's JSON bytes for `claims` (what is signed).
pub fn encode_statement(claims: &Claims) -> Vec<u8> {
    let mut digest = std::collections::BTreeMap::new();
    digest.insert(ROOT_DIGEST.to_string(), claims.root.to_hex());
    let ms = claims.model_signing.as_ref();
    if let Some(m) = ms {
        digest.insert("sha256".to_string(), model_signing_root(&m.files));
    }
    let statement = Statement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject { name: claims.name.clone(), digest }],
        predicate_type: if ms.is_some() { MODEL_SIGNING_PREDICATE_TYPE } else { PREDICATE_TYPE }.into(),
        predicate: Predicate {
            format_version: claims.format_version,
            metadata_blake3: claims.metadata.map(|h| h.to_hex()),
            signed_at: time::format_utc(claims.signed_at_ms),
            tree_version: claims.tree_version,
            signer: claims
                .signer
                .as_ref()
                .map(|k| Signer { algorithm: k.algorithm().name().into(), public_key: b64(&k.to_der()) }),
            resources: ms.map(|m| {
                m.files
                    .iter()
                    .map(|(name, d)| Resource {
                        algorithm: "sha256".into(),
                        digest: Hash32(*d).to_hex(),
                        name: name.clone(),
                    })
                    .collect()
            }),
            serialization: ms.map(|m| Serialization {
                method: "files".into(),
                hash_type: "sha256".into(),
                allow_symlinks: false,
                ignore_paths: m.ignore_paths.clone(),
            }),
        },
    };
    // Serializing plain strings and numbers into a Vec cannot fail.
    serde_json::to_vec(&statement).unwrap_or_default()
}

/// Parse a statement's JSON bytes.
///
/// # Errors
/// What is wrong, for a message.
pub fn decode_statement(bytes: &[u8]) -> Result<Claims, String> {
    let s: Statement = serde_json::from_slice(bytes).map_err(|e| format!("not a treepack signature statement: {e}"))?;
    if s.type_ != STATEMENT_TYPE {
        return Err(format!("statement _type {:?}, not {STATEMENT_TYPE:?}", s.type_));
    }
    if s.predicate_type != PREDICATE_TYPE && s.predicate_type != MODEL_SIGNING_PREDICATE_TYPE {
        return Err(format!("predicateType {:?}, not {PREDICATE_TYPE:?}", s.predicate_type));
    }
    let [subject] = <[Subject; 1]>::try_from(s.subject)
        .map_err(|v| format!("{} subjects; a tree signature has one, the tree", v.len()))?;
    let root = subject.digest.get(ROOT_DIGEST).ok_or_else(|| {
        format!("the subject has no {ROOT_DIGEST} digest: this signature is not over a treepack tree's root hash")
    })?;
    let p = s.predicate;
    let signer = match p.signer {
        Some(sg) => {
            let k = VerifyingKey::from_der(&b64_decode("the signer's public key", &sg.public_key)?)?;
            if k.algorithm().name() != sg.algorithm {
                return Err(format!(
                    "the signer's key is {}, the statement says {}",
                    k.algorithm().name(),
                    sg.algorithm
                ));
            }
            Some(k)
        }
        None => None,
    };
    let model_signing = match (p.resources, p.serialization) {
        (Some(r), Some(ser)) => Some(ModelSigning {
            files: r
                .into_iter()
                .map(|r| Ok((r.name, hex32("a resource digest", &r.digest)?.0)))
                .collect::<Result<_, String>>()?,
            ignore_paths: ser.ignore_paths,
        }),
        _ => None,
    };
    Ok(Claims {
        name: subject.name,
        root: hex32("the root hash", root)?,
        format_version: p.format_version,
        metadata: p.metadata_blake3.as_deref().map(|h| hex32("metadataBlake3", h)).transpose()?,
        signed_at_ms: time::parse_utc(&p.signed_at)?,
        tree_version: p.tree_version,
        signer,
        model_signing,
    })
}

/// Sign `claims` with `key`: the signature file's bytes, a Sigstore bundle (v0.3) holding the
/// DSSE envelope, followed by a newline. The bundle's key hint and the signature's `keyid` are
/// the key's fingerprint. Deterministic for given claims and key.
pub fn sign(claims: &Claims, key: &SigningKey) -> Vec<u8> {
    let payload = encode_statement(claims);
    let sig = key.sign(&pae(PAYLOAD_TYPE, &payload));
    let fp = key.verifying_key().fingerprint();
    let file = serde_json::json!({
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": fp}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": b64(&payload),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": b64(&sig), "keyid": fp}],
        },
    });
    let mut out = serde_json::to_vec(&file).unwrap_or_default();
    out.push(b'\n');
    out
}

impl Claims {
    /// Whether these claims hold for a tree with this root, format version and metadata hash:
    /// `Err` says what differs.
    ///
    /// # Errors
    /// The first difference, for a message.
    pub fn matches(&self, root: &Hash32, version: (u16, u16), metadata: Option<&Hash32>) -> Result<(), String> {
        if &self.root != root {
            return Err(format!(
                "the signature is over root hash {}, the tree's is {}: the tree was modified or replaced since it \
                 was signed, or this is another tree's signature",
                self.root.to_hex(),
                root.to_hex()
            ));
        }
        if self.format_version != version {
            return Err(format!(
                "the signature is over format version {}.{}, the manifest says {}.{}",
                self.format_version.0, self.format_version.1, version.0, version.1
            ));
        }
        if self.metadata.as_ref() != metadata {
            let show = |m: Option<&Hash32>| m.map_or_else(|| "none".to_string(), Hash32::to_hex);
            return Err(format!(
                "the tree's metadata changed since it was signed (signed metadata BLAKE3 {}, now {})",
                show(self.metadata.as_ref()),
                show(metadata)
            ));
        }
        Ok(())
    }
}
