//! Signed trees (docs/signing.md, docs/format.md section 12): who wrote a tree, and that nobody
//! changed it since.
//!
//! A signature is over the tree's root hash (docs/format.md section 9) with its format version
//! and metadata — all from the manifest — so it is checked without reading array data, before
//! a load returns anything, and it holds for the tree in every layout: `treepack cp` carries it
//! between a directory, a `.tpk` and a repository. Chunk reads stay hash-checked against the
//! manifest whose root was signed, so a load that passed the check reads exactly the signed
//! bytes or fails. The format (envelope, statement, keys) is
//! [`format::signature`](crate::format::signature); this module is where signatures live and
//! how they are written, carried and checked.
//!
//! Where a signature lives:
//!
//! | location | signature file |
//! | --- | --- |
//! | directory `ckpt/` | `ckpt/treepack.sig`, beside the manifest |
//! | single file `model.tpk` | `model.tpk.sig`, beside the file |
//! | repository tree `runs@step-1` | `runs/signatures/step-1.sig` |

mod files;

pub use crate::format::signature::{Algorithm, Claims, SigningKey, VerifyingKey};

use crate::error::{Error, Result};
use crate::format::hash::Hash32;
use crate::format::manifest::Manifest;
use crate::format::signature as sig;
use crate::store::{self, Layout};
use crate::{IntoLocation, Location, Reader};
use bytes::Bytes;
use std::time::{SystemTime, UNIX_EPOCH};

/// A directory's signature file, beside `treepack.json`.
pub const DIR_SIGNATURE: &str = "treepack.sig";
/// What a single file's signature file adds to its name (`model.tpk.sig`).
pub const SIDECAR_SUFFIX: &str = ".sig";
/// A repository's folder of signatures, one per named tree (`signatures/<name>.sig`).
pub const REPO_SIGNATURES: &str = "signatures";

/// Options of [`sign`].
#[derive(Debug, Clone, Default)]
pub struct SignOptions {
    /// A version number for this tree, raised with each release: verifiers can refuse older
    /// ones ([`SignedBy::min_version`]) — the rollback check a signature alone cannot make.
    pub tree_version: Option<u64>,
    /// The tree's name in the statement (default: the location's last name, or the tree name in
    /// a repository). Informational.
    pub name: Option<String>,
    /// Also list every file's SHA-256 as the OpenSSF model-signing specification does, so that
    /// its verifier (`model_signing verify key`, P-256 keys) checks this layout's files too.
    /// Reads every byte of the tree; a copy to another layout keeps the treepack signature but
    /// not these digests' meaning.
    pub model_signing: bool,
    /// The signing time to state (default: now).
    pub signed_at: Option<SystemTime>,
}

/// What a signed load requires ([`crate::LoadOptions::signed_by`]): a signature by one of
/// `keys` over this very tree, and optionally how recent it must be.
#[derive(Debug, Clone, Default)]
pub struct SignedBy {
    /// The public keys trusted (any one suffices).
    pub keys: Vec<VerifyingKey>,
    /// Refuse a signature whose tree version is lower (or missing): protects against a tree
    /// rolled back to an older signed release.
    pub min_version: Option<u64>,
    /// Refuse a signature made before this time: the same protection by date.
    pub not_before: Option<SystemTime>,
}

impl SignedBy {
    /// Trust these keys, with no rollback check.
    pub fn keys(keys: impl IntoIterator<Item = VerifyingKey>) -> SignedBy {
        SignedBy { keys: keys.into_iter().collect(), ..Default::default() }
    }
}

/// A signature found on a tree.
#[derive(Debug, Clone)]
pub struct SignatureInfo {
    /// The signature file.
    pub file: String,
    /// What it states.
    pub claims: Claims,
    /// Who signed: the trusted key that verified it ([`verify_signature`]), or, from
    /// [`signature`], the key the statement names when the signature verifies under it.
    pub signer: Option<VerifyingKey>,
    /// Whether the signer is a key the caller trusts (checked by [`verify_signature`]).
    pub trusted: bool,
    /// `None` when the statement holds for the tree (root, format version, metadata); else
    /// what differs.
    pub mismatch: Option<String>,
}

impl SignatureInfo {
    /// As `inspect --json`, `verify --json` and the Python package show it.
    pub fn to_json(&self) -> serde_json::Value {
        let c = &self.claims;
        serde_json::json!({
            "file": self.file,
            "name": c.name,
            "root": c.root.to_hex(),
            "format_version": [c.format_version.0, c.format_version.1],
            "metadata_blake3": c.metadata.map(|h| h.to_hex()),
            "signed_at": sig::time::format_utc(c.signed_at_ms),
            "signed_at_ms": c.signed_at_ms,
            "tree_version": c.tree_version,
            "algorithm": self.signer.as_ref().map(|k| k.algorithm().name()),
            "fingerprint": self.signer.as_ref().map(VerifyingKey::fingerprint),
            "trusted": self.trusted,
            "matches_tree": self.mismatch.is_none(),
            "mismatch": self.mismatch,
            "model_signing_files": c.model_signing.as_ref().map(|m| m.files.len()),
        })
    }
}

/// A key as messages show it: `ed25519 key 1a2b3c4d5e6f7a8b`.
pub fn describe(k: &VerifyingKey) -> String {
    format!("{} key {}", k.algorithm().name(), &k.fingerprint()[..16])
}

fn describe_all(keys: &[VerifyingKey]) -> String {
    keys.iter().map(describe).collect::<Vec<_>>().join(", ")
}

fn ms_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Read a private key from a PEM file.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read, [`Error::BadKey`] for what it holds.
pub fn read_signing_key(path: impl AsRef<std::path::Path>) -> Result<SigningKey> {
    let p = path.as_ref();
    let text = std::fs::read_to_string(p).map_err(|e| Error::Io { path: p.to_path_buf(), source: e })?;
    SigningKey::from_pem(&text).map_err(|reason| Error::BadKey { file: p.display().to_string(), reason })
}

/// Read a public key from a PEM file (a private key's public half is taken too).
///
/// # Errors
/// As [`read_signing_key`].
pub fn read_verifying_key(path: impl AsRef<std::path::Path>) -> Result<VerifyingKey> {
    let p = path.as_ref();
    let text = std::fs::read_to_string(p).map_err(|e| Error::Io { path: p.to_path_buf(), source: e })?;
    VerifyingKey::from_pem(&text).map_err(|reason| Error::BadKey { file: p.display().to_string(), reason })
}

/// A new key pair from the operating system's random numbers.
///
/// # Errors
/// [`Error::Internal`] when the system has no randomness to give.
pub fn generate_key(algorithm: Algorithm) -> Result<SigningKey> {
    loop {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| Error::internal(format!("no random numbers for a key: {e}")))?;
        // A P-256 secret must be below the group order: random bytes are but for a 2^-32 chance.
        if let Ok(k) = SigningKey::from_secret_bytes(algorithm, &secret) {
            return Ok(k);
        }
    }
}

/// Where `loc`'s signature file lies: the store location holding it, and its path there.
///
/// # Errors
/// [`Error::BadLocation`] for a tree read from another tool's file (it has no signature of its
/// own: store it as a treepack tree, then sign that).
pub fn place(loc: &Location) -> Result<(store::Location, String)> {
    if let Some(kind) = loc.read_from() {
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: format!(
                "a tree read from a {kind} has no treepack signature: store it as a treepack tree (`treepack cp`, \
                 `treepack convert`) and sign that"
            ),
        });
    }
    Ok(match (loc.layout(), loc.tree_name()) {
        (Layout::Directory, Some(name)) => {
            (loc.repository().store().clone(), format!("{REPO_SIGNATURES}/{name}{SIDECAR_SUFFIX}"))
        }
        (Layout::Directory, None) => (loc.store().clone(), DIR_SIGNATURE.to_string()),
        (Layout::SingleFile, _) => (loc.store().sidecar(SIDECAR_SUFFIX)?, ".".to_string()),
    })
}

/// The signature file's bytes, or `None` when there is none.
async fn read_envelope(place: &store::Location, rel: &str) -> Result<Option<Bytes>> {
    match place.get_opt(rel, sig::MAX_ENVELOPE_BYTES).await {
        Err(Error::LimitExceeded { detail, .. }) => {
            Err(Error::InvalidSignature { file: place.file_name(rel), reason: format!("too big: {detail}") })
        }
        other => other,
    }
}

/// The name a statement gives a tree by default: its name in a repository, else the last name
/// of its location.
fn default_name(loc: &Location) -> String {
    if let Some(n) = loc.tree_name() {
        return n.to_string();
    }
    let d = loc.display().trim_end_matches('/');
    d.rsplit(['/', '\\']).next().filter(|s| !s.is_empty()).unwrap_or(d).to_string()
}

/// Sign the tree at `location` with `key`: writes its signature file (replacing one that is
/// there). Reads the manifest only, unless `opts.model_signing`.
///
/// # Errors
/// As [`crate::open`]; [`Error::ReadOnly`] where the signature cannot be written;
/// [`Error::BadLocation`] for a tree read from another tool's file.
pub async fn sign_async(location: impl IntoLocation, key: &SigningKey, opts: &SignOptions) -> Result<SignatureInfo> {
    let loc = location.into_location()?;
    let (place, rel) = place(&loc)?;
    place.refuse_write()?;
    let r = Reader::open_async(loc.clone()).await?;
    let m = r.manifest();
    let model_signing = match opts.model_signing {
        true => Some(files::digests(&loc, m, &rel).await?),
        false => None,
    };
    let claims = Claims {
        name: opts.name.clone().unwrap_or_else(|| default_name(&loc)),
        root: r.root_hash(),
        format_version: m.version,
        metadata: sig::metadata_hash(m.metadata.as_ref()),
        signed_at_ms: ms_of(opts.signed_at.unwrap_or_else(SystemTime::now)) / 1000 * 1000,
        tree_version: opts.tree_version,
        signer: Some(key.verifying_key()),
        model_signing,
    };
    let bytes = sig::sign(&claims, key);
    place.put(&rel, vec![Bytes::from(bytes)], false).await?;
    Ok(SignatureInfo {
        file: place.file_name(&rel),
        claims,
        signer: Some(key.verifying_key()),
        trusted: true,
        mismatch: None,
    })
}

/// Blocking [`sign_async`].
///
/// # Errors
/// As [`sign_async`].
pub fn sign(location: impl IntoLocation, key: &SigningKey, opts: &SignOptions) -> Result<SignatureInfo> {
    let loc = location.into_location()?;
    loc.clone().block_on(sign_async(loc, key, opts))
}

/// The signature on the tree at `location`, if any, as it states itself: who it names, whether
/// the key it names made it, whether it holds for the tree. Nothing here is trusted — that
/// needs the caller's key ([`verify_signature`]); this is what `inspect` shows.
///
/// # Errors
/// As [`crate::open`]; [`Error::InvalidSignature`] for a malformed signature file.
pub fn signature(location: impl IntoLocation) -> Result<Option<SignatureInfo>> {
    let loc = location.into_location()?;
    loc.clone().block_on(async move { open_for_check(loc).await?.signature_async().await })
}

/// Check that the tree at `location` is signed by one of `by.keys`, reading its manifest and
/// signature only.
///
/// # Errors
/// [`Error::Unsigned`], [`Error::UntrustedSigner`], [`Error::SignatureMismatch`] (modified,
/// another tree's, or older than `by` accepts), [`Error::InvalidSignature`]; as [`crate::open`].
pub fn verify_signature(location: impl IntoLocation, by: &SignedBy) -> Result<SignatureInfo> {
    let loc = location.into_location()?;
    loc.clone().block_on(async move {
        let r = open_for_check(loc).await?;
        let out = r.verify_signature_async(by).await;
        // Freeing a 100k-leaf manifest takes milliseconds the caller need not wait for.
        crate::save::drop_in_background(r);
        out
    })
}

/// Check the signature of the tree whose manifest `bytes` (named `file`) were read from `loc`:
/// what a signed load does with the manifest it is about to build from, so that the tree it
/// returns is the one checked.
///
/// # Errors
/// As [`verify_signature`]; the manifest's parse errors.
pub async fn check_bytes(loc: &Location, bytes: &[u8], file: &str, by: &SignedBy) -> Result<SignatureInfo> {
    let r = reader_over(loc.clone(), bytes.to_vec(), file.to_string()).await?;
    let out = r.verify_signature_async(by).await;
    crate::save::drop_in_background(r);
    out
}

/// A reader for a check: the manifest parsed by the streamed builder (on a helper thread for a
/// big one: a 100k-leaf manifest in ~18 ms where [`Reader::open`]'s parse takes ~30), which
/// builds the same tree by the same rules, its packs checked against the layout as
/// [`Reader::open`] checks them.
async fn open_for_check(loc: Location) -> Result<Reader> {
    let loc = loc.pin()?;
    let (bytes, file) = crate::read::manifest_bytes(&loc).await?;
    reader_over(loc, bytes.to_vec(), file).await
}

/// [`open_for_check`] over manifest bytes already read.
async fn reader_over(loc: Location, bytes: Vec<u8>, file: String) -> Result<Reader> {
    use crate::format::manifest::{self, OwnedTree};
    let f = file.clone();
    let p = crate::runtime::maybe_spawn_blocking(move || manifest::build(&bytes, &f, &OwnedTree)).await?;
    if let Some(bad) = p.packs.iter().find(|p| !loc.layout().allows_pack(&p.path)) {
        return Err(Error::manifest(&file, "packs", format!("pack `{}` is not allowed in this layout", bad.path)));
    }
    let m = Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
    Ok(Reader::from_parts(loc, m, file))
}

impl Reader {
    /// [`signature`] of the tree this reader opened.
    ///
    /// # Errors
    /// As [`signature`].
    pub async fn signature_async(&self) -> Result<Option<SignatureInfo>> {
        if self.location().read_from().is_some() {
            return Ok(None);
        }
        let (place, rel) = place(self.location())?;
        let file = place.file_name(&rel);
        let Some(bytes) = read_envelope(&place, &rel).await? else { return Ok(None) };
        let bad = |reason: String| Error::InvalidSignature { file: file.clone(), reason };
        let env = sig::parse(&bytes).map_err(bad)?;
        let claims = env.claims().map_err(bad)?;
        let signer = claims.signer.clone().filter(|_| env.self_consistent(&claims));
        let mismatch = self.claims_hold(&claims).err();
        Ok(Some(SignatureInfo { file, claims, signer, trusted: false, mismatch }))
    }

    /// Whether `claims` hold for this tree: its root hash, format version and metadata.
    fn claims_hold(&self, claims: &Claims) -> std::result::Result<(), String> {
        claims_hold(self.manifest(), &self.root_hash(), claims)
    }

    /// [`verify_signature`] of the tree this reader opened: the signature is checked against
    /// this reader's manifest, the one its reads are hash-checked against.
    ///
    /// # Errors
    /// As [`verify_signature`].
    pub async fn verify_signature_async(&self, by: &SignedBy) -> Result<SignatureInfo> {
        let loc = self.location();
        if by.keys.is_empty() {
            return Err(Error::BadKey { file: "signed_by".into(), reason: "no public key given to check with".into() });
        }
        let trusted = describe_all(&by.keys);
        if loc.read_from().is_some() {
            return Err(Error::Unsigned {
                location: loc.display().to_string(),
                file: format!(
                    "{} (read from a {}, which holds none)",
                    loc.display(),
                    loc.read_from().unwrap_or("file")
                ),
                trusted,
            });
        }
        let (place, rel) = place(loc)?;
        let file = place.file_name(&rel);
        let Some(bytes) = read_envelope(&place, &rel).await? else {
            return Err(Error::Unsigned { location: loc.display().to_string(), file, trusted });
        };
        let invalid = |reason: String| Error::InvalidSignature { file: file.clone(), reason };
        let env = sig::parse(&bytes).map_err(invalid)?;
        let key = match env.check(&by.keys) {
            sig::Check::Verified { key } => &by.keys[key],
            sig::Check::NotVerified { names_trusted: Some(k), .. } => {
                return Err(invalid(format!(
                    "it names the trusted {} but its signature does not verify: the signature file or the statement \
                     in it was altered",
                    describe(&by.keys[k])
                )))
            }
            sig::Check::NotVerified { claimed, .. } => {
                let signers = match claimed.is_empty() {
                    true => "an unknown key".to_string(),
                    // Key ids are the file's text: shown cut short and escaped.
                    false => claimed
                        .iter()
                        .take(4)
                        .map(|c| format!("key {}", c.chars().take(16).collect::<String>().escape_debug()))
                        .collect::<Vec<_>>()
                        .join(", "),
                };
                return Err(Error::UntrustedSigner { location: loc.display().to_string(), signers, trusted });
            }
        };
        // Signed by a trusted key: from here on the statement is the signer's word.
        let claims = env.claims().map_err(|r| invalid(format!("signed by {}, but {r}", describe(key))))?;
        let mismatch = |reason: String| Error::SignatureMismatch {
            location: loc.display().to_string(),
            signer: describe(key),
            reason,
        };
        self.claims_hold(&claims).map_err(|r| {
            mismatch(format!(
                "{r}; load it without signed_by to look at it, or have the signer sign the tree as it is now"
            ))
        })?;
        if let Some(min) = by.min_version {
            match claims.tree_version {
                Some(v) if v >= min => {}
                Some(v) => {
                    return Err(mismatch(format!(
                        "it signs tree version {v}, older than min_version {min}: an older signed tree (rolled back?)"
                    )))
                }
                None => {
                    return Err(mismatch(format!(
                        "it carries no tree version and min_version {min} was asked for: sign with a tree version \
                         (--tree-version)"
                    )))
                }
            }
        }
        if let Some(nb) = by.not_before.map(ms_of) {
            if claims.signed_at_ms < nb {
                return Err(mismatch(format!(
                    "it was signed at {}, before not_before {}: an older signed tree (rolled back?)",
                    sig::time::format_utc(claims.signed_at_ms),
                    sig::time::format_utc(nb)
                )));
            }
        }
        Ok(SignatureInfo { file, claims, signer: Some(key.clone()), trusted: true, mismatch: None })
    }
}

/// Whether `claims` hold for the tree of `m` (root hash `root`).
fn claims_hold(m: &Manifest, root: &Hash32, claims: &Claims) -> std::result::Result<(), String> {
    claims.matches(root, m.version, sig::metadata_hash(m.metadata.as_ref()).as_ref())
}

/// What [`copy_signature`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carried {
    /// The source's signature now signs the copy too.
    Copied,
    /// The source is not signed (a stale signature at the destination was removed).
    Unsigned,
    /// The source's signature does not hold for the copy (the copy is another tree: its root,
    /// format version or metadata differ), so it was not copied: why.
    NotCarried(String),
}

/// Carry the signature of the tree at `src` to its copy at `dst` (what `treepack cp` does
/// after copying): the signature file is copied byte for byte once its statement is found to
/// hold for the copy — the root hash does not depend on the layout, so it does across a
/// directory, a `.tpk` and a repository. A destination signature left from an earlier tree
/// is removed when the source has none.
///
/// # Errors
/// Storage errors; [`Error::InvalidSignature`] for a malformed source signature.
pub async fn copy_signature_async(src: &Location, dst: &Location) -> Result<Carried> {
    let (dst_place, dst_rel) = place(dst)?;
    let src_bytes = match src.read_from() {
        Some(_) => None,
        None => {
            let (p, rel) = place(src)?;
            read_envelope(&p, &rel).await?.map(|b| (b, p.file_name(&rel)))
        }
    };
    let Some((bytes, file)) = src_bytes else {
        match dst_place.delete(&dst_rel).await {
            Ok(()) | Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        return Ok(Carried::Unsigned);
    };
    let bad = |reason: String| Error::InvalidSignature { file: file.clone(), reason };
    let claims = sig::parse(&bytes).and_then(|e| e.claims()).map_err(bad)?;
    let r = open_for_check(dst.clone()).await?;
    if let Err(why) = r.claims_hold(&claims) {
        return Ok(Carried::NotCarried(why));
    }
    dst_place.put(&dst_rel, vec![bytes], false).await?;
    Ok(Carried::Copied)
}

/// Blocking [`copy_signature_async`].
///
/// # Errors
/// As [`copy_signature_async`].
pub fn copy_signature(src: &Location, dst: &Location) -> Result<Carried> {
    crate::block_on(copy_signature_async(src, dst))
}

/// The guide's examples, compiled and run as doctests.
#[doc = include_str!("../../../../docs/signing.md")]
#[cfg(doctest)]
pub struct SigningDoctests;
