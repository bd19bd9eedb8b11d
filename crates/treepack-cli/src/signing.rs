//! Signed trees on the command line (docs/signing.md): `treepack keygen`, `treepack sign`,
//! `verify --signed-by`, the signature line of `inspect`, and the signature `cp` carries.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use treepack::sign::{self, Algorithm, Carried, SignatureInfo, SignedBy};
use treepack::{Location, Reader, SignOptions, StorageOptions};

/// `treepack sign`.
#[derive(clap::Args)]
pub struct SignArgs {
    /// The tree: a directory, a .tpk, LOCATION@NAME of a repository, or a remote location.
    location: String,
    /// The private key (PEM: PKCS#8 Ed25519 or P-256, or SEC1 P-256), e.g. from `treepack keygen`.
    #[arg(long, value_name = "KEY.pem")]
    key: PathBuf,
    /// A version number for this tree, raised with each release: `--min-version` (load's
    /// min_version=) then refuses older signed trees rolled back into its place.
    #[arg(long, value_name = "N")]
    tree_version: Option<u64>,
    /// The tree's name in the signed statement (default: the location's last name).
    #[arg(long)]
    name: Option<String>,
    /// Also sign every file's SHA-256 as the OpenSSF model-signing specification lists them,
    /// so that `model_signing verify key` (P-256 keys) checks this layout's files too; reads
    /// every byte of the tree.
    #[arg(long)]
    model_signing: bool,
}

/// `treepack keygen`.
#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Where the private key goes (KEY.pem); the public key is written beside it as KEY.pub.pem.
    key: PathBuf,
    /// ed25519 (default) or ecdsa-p256 (the one the model-signing verifier checks).
    #[arg(long, default_value = "ed25519")]
    algorithm: String,
    /// Replace existing key files.
    #[arg(long)]
    overwrite: bool,
}

/// The signature a reading command requires.
#[derive(clap::Args)]
pub struct SignedByArgs {
    /// Require a signature by this public key (repeatable: any one of them), checked before
    /// any data is read.
    #[arg(long = "signed-by", value_name = "KEY.pub.pem")]
    signed_by: Vec<PathBuf>,
    /// With --signed-by: refuse a signed tree version below N (rolled back to an older release).
    #[arg(long, value_name = "N", requires = "signed_by")]
    min_version: Option<u64>,
    /// With --signed-by: refuse a signature made before this UTC time (2026-11-22 or
    /// 2026-11-22T10:00:00Z).
    #[arg(long, value_name = "TIME", requires = "signed_by")]
    not_before: Option<String>,
}

impl SignedByArgs {
    /// What the arguments require, `None` when no key was given.
    pub fn policy(&self) -> Result<Option<SignedBy>> {
        if self.signed_by.is_empty() {
            return Ok(None);
        }
        let keys = self.signed_by.iter().map(sign::read_verifying_key).collect::<treepack::Result<Vec<_>>>()?;
        let not_before = match &self.not_before {
            Some(t) => {
                let ms = treepack::format::signature::time::parse_utc(t).map_err(anyhow::Error::msg)?;
                Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
            }
            None => None,
        };
        Ok(Some(SignedBy { keys, min_version: self.min_version, not_before }))
    }
}

/// `KEY.pub.pem` beside `KEY.pem` (or `KEY` + `.pub.pem`).
fn public_path(private: &Path) -> PathBuf {
    let s = private.to_string_lossy();
    PathBuf::from(match s.strip_suffix(".pem") {
        Some(stem) => format!("{stem}.pub.pem"),
        None => format!("{s}.pub.pem"),
    })
}

/// Write `text` to `path`, private to its owner when `secret`; refusing to replace a file
/// unless `overwrite`.
fn write_key_file(path: &Path, text: &str, secret: bool, overwrite: bool) -> Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    if overwrite {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let _ = secret;
    let mut f = o.open(path).with_context(|| {
        format!("cannot write {}{}", path.display(), if overwrite { "" } else { " (pass --overwrite to replace it)" })
    })?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub fn keygen(a: KeygenArgs) -> Result<ExitCode> {
    let Some(alg) = Algorithm::from_name(&a.algorithm) else {
        bail!("unknown --algorithm {:?}: use ed25519 or ecdsa-p256", a.algorithm)
    };
    let key = sign::generate_key(alg)?;
    let public = public_path(&a.key);
    write_key_file(&a.key, &key.to_pem().map_err(anyhow::Error::msg)?, true, a.overwrite)?;
    write_key_file(&public, &key.verifying_key().to_pem(), false, a.overwrite)?;
    println!(
        "wrote {} (private: keep it secret) and {} (public: give it to whoever checks your trees); {}",
        a.key.display(),
        public.display(),
        sign::describe(&key.verifying_key())
    );
    Ok(ExitCode::SUCCESS)
}

pub fn sign_cmd(a: SignArgs, so: &StorageOptions) -> Result<ExitCode> {
    let key = sign::read_signing_key(&a.key)?;
    let loc = crate::keys::source(Location::parse_with(&a.location, so)?)?;
    let opts =
        SignOptions { tree_version: a.tree_version, name: a.name, model_signing: a.model_signing, signed_at: None };
    let info = sign::sign(loc, &key, &opts).with_context(|| format!("signing `{}`", a.location))?;
    println!("signed {} with {}: wrote {}", a.location, sign::describe(&key.verifying_key()), info.file);
    println!("root {}{}", info.claims.root.to_hex(), version_text(&info));
    Ok(ExitCode::SUCCESS)
}

fn version_text(info: &SignatureInfo) -> String {
    info.claims.tree_version.map(|v| format!(", tree version {v}")).unwrap_or_default()
}

/// The signature as `inspect --json` and `verify --json` show it.
pub fn to_json(info: &SignatureInfo) -> Value {
    info.to_json()
}

/// What `inspect` says about the signature: who signed and whether it holds for the tree —
/// never trusted (that needs `verify --signed-by`). A damaged one is shown, not an error.
pub fn inspect(r: &Reader) -> (Option<String>, Value) {
    match r.location().block_on(r.signature_async()) {
        Ok(None) => (Some("signature: none (`treepack sign` signs it)".into()), Value::Null),
        Ok(Some(info)) => {
            let who = match &info.signer {
                Some(k) => format!("{}, fingerprint {}", k.algorithm().name(), k.fingerprint()),
                None => "a key it does not name or whose signature does not verify".into(),
            };
            let state = match &info.mismatch {
                None => "holds for this tree".to_string(),
                Some(why) => format!("DOES NOT hold for this tree: {why}"),
            };
            let line = format!(
                "signature: signed by {who} at {}{}; {state} (check it with `treepack verify --signed-by KEY.pub.pem`)",
                treepack::format::signature::time::format_utc(info.claims.signed_at_ms),
                version_text(&info)
            );
            (Some(line), to_json(&info))
        }
        // A tree read from another tool's file has no place for one: nothing to say.
        Err(treepack::Error::BadLocation { .. }) => (None, Value::Null),
        Err(e) => (Some(format!("signature: invalid: {e}")), json!({"error": e.to_string()})),
    }
}

/// The signature check of `verify --signed-by`: `Ok(None)` when none was asked for.
pub fn check(r: &Reader, a: &SignedByArgs) -> Result<Option<Result<SignatureInfo, treepack::Error>>> {
    let Some(by) = a.policy()? else { return Ok(None) };
    Ok(Some(r.location().block_on(r.verify_signature_async(&by))))
}

/// After `cp` copied `src` to `dst`: carry its signature, and say what became of it.
pub fn carry(src: &str, dst: &str, so: &StorageOptions) -> Result<Option<String>> {
    let (s, d) = (
        crate::keys::source(Location::parse_with(src, so)?)?,
        crate::keys::destination(Location::parse_with(dst, so)?)?,
    );
    Ok(match sign::copy_signature(&s, &d).with_context(|| format!("carrying the signature of `{src}`"))? {
        Carried::Copied => Some(format!("signature carried to {dst} (the root hash is the same)")),
        Carried::Unsigned => None,
        Carried::NotCarried(why) => Some(format!("signature NOT carried: the copy is not the signed tree: {why}")),
    })
}

/// `treepack verify`: with --signed-by, the signature first (a failed check ends it: nothing
/// is read from a tree not trusted), then every chunk re-hashed against the manifest.
pub fn verify(path: &str, so: &StorageOptions, as_json: bool, signed: &SignedByArgs) -> Result<ExitCode> {
    let r = crate::open(path, so)?;
    let signature = match check(&r, signed)? {
        None => None,
        Some(Ok(info)) => Some(info),
        Some(Err(e)) => {
            match as_json {
                true => println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({"ok": false, "signature_ok": false, "signature_error": e.to_string(), "signature_error_kind": e.kind()}))?
                ),
                false => println!("SIGNATURE REFUSED {e}\nFAILED: the tree is not the one signed by the key given; no chunk was checked"),
            }
            return Ok(ExitCode::from(1));
        }
    };
    let rep = r.verify()?;
    if as_json {
        let problems: Vec<_> = rep
            .problems
            .iter()
            .map(|p| json!({"file": p.file, "key": p.key, "chunk": p.chunk, "reason": p.reason}))
            .collect();
        let mut out = json!({"ok": rep.ok(), "chunks_checked": rep.chunks_checked, "bytes_checked": rep.bytes_checked, "problems": problems});
        if let Some(info) = &signature {
            out["signature_ok"] = json!(true);
            out["signature"] = to_json(info);
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if let Some(info) = &signature {
            let k = info.signer.as_ref().map(sign::describe).unwrap_or_default();
            println!(
                "signature OK: signed by {k} at {}{}; chunks are checked against the signed manifest",
                treepack::format::signature::time::format_utc(info.claims.signed_at_ms),
                version_text(info)
            );
        }
        for p in &rep.problems {
            match p.chunk {
                Some(c) => println!("CORRUPT {} chunk {c} in {}: {}", p.key, p.file, p.reason),
                None => println!("CORRUPT {}: {}", p.file, p.reason),
            }
        }
        crate::print_verify_summary(&rep);
    }
    Ok(if rep.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
