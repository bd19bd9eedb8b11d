//! Keys of encrypted trees on the command line (docs/encryption.md): `--encryption-key FILE`
//! (32 raw bytes or 64 hex digits) or `--passphrase-env VAR` for every treepack location a
//! command names; for a copy's destination, `--dst-encryption-key` / `--dst-passphrase-env`, or
//! `--decrypt` to write it plain (by default a copy keeps the source's key).

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::OnceLock;
use treepack::{KeySource, Location};

/// The flags.
#[derive(clap::Args, Clone, Default)]
pub struct KeyArgs {
    /// The key of encrypted trees: a file of 32 bytes, raw or as 64 hex digits
    /// (`head -c 32 /dev/urandom > KEY`). Reads open only a tree encrypted with it; saves
    /// encrypt with it.
    #[arg(long, value_name = "FILE", global = true)]
    encryption_key: Option<PathBuf>,
    /// Take a passphrase for encrypted trees from this environment variable (stretched by
    /// Argon2id).
    #[arg(long, value_name = "VAR", global = true, conflicts_with = "encryption_key")]
    passphrase_env: Option<String>,
    /// The key a copy or conversion encrypts its treepack destination with (default: the key
    /// above).
    #[arg(long, value_name = "FILE", global = true)]
    dst_encryption_key: Option<PathBuf>,
    /// As --passphrase-env, for the destination.
    #[arg(long, value_name = "VAR", global = true, conflicts_with = "dst_encryption_key")]
    dst_passphrase_env: Option<String>,
    /// Write the destination of a copy or conversion unencrypted, though the source is.
    #[arg(long, global = true, conflicts_with_all = ["dst_encryption_key", "dst_passphrase_env"])]
    decrypt: bool,
}

static SOURCE: OnceLock<Option<KeySource>> = OnceLock::new();
static DESTINATION: OnceLock<Option<KeySource>> = OnceLock::new();

fn read_key(file: &PathBuf) -> Result<KeySource> {
    let b = std::fs::read(file).with_context(|| format!("reading the encryption key {}", file.display()))?;
    let text = std::str::from_utf8(&b).ok().map(str::trim).filter(|t| t.len() == 64);
    let key: Option<[u8; 32]> = match text {
        Some(t) => (0..32)
            .map(|i| u8::from_str_radix(&t[2 * i..2 * i + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()
            .and_then(|v| v.try_into().ok()),
        None => b.as_slice().try_into().ok(),
    };
    match key {
        Some(k) => Ok(KeySource::Key(k)),
        None => bail!(
            "{}: an encryption key file holds 32 bytes, raw or as 64 hex digits ({} bytes here); make one with \
             `head -c 32 /dev/urandom > KEY`, or use --passphrase-env",
            file.display(),
            b.len()
        ),
    }
}

fn passphrase(var: &str) -> Result<KeySource> {
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => Ok(KeySource::Passphrase(p)),
        Ok(_) => bail!("the environment variable {var} (--passphrase-env) is empty"),
        Err(_) => bail!("the environment variable {var} (--passphrase-env) is not set"),
    }
}

/// Read the keys the flags name, once, before the command runs.
pub fn install(a: &KeyArgs) -> Result<()> {
    let source = match (&a.encryption_key, &a.passphrase_env) {
        (Some(f), _) => Some(read_key(f)?),
        (None, Some(v)) => Some(passphrase(v)?),
        (None, None) => None,
    };
    let dst = match (&a.dst_encryption_key, &a.dst_passphrase_env) {
        _ if a.decrypt => None,
        (Some(f), _) => Some(read_key(f)?),
        (None, Some(v)) => Some(passphrase(v)?),
        (None, None) => source.clone(),
    };
    let _ = SOURCE.set(source);
    let _ = DESTINATION.set(dst);
    Ok(())
}

fn apply(loc: Location, key: Option<&KeySource>) -> Result<Location> {
    match key {
        Some(k) => Ok(loc.with_encryption(k.clone())?),
        None => Ok(loc),
    }
}

/// Whether a key was given for the trees a command reads.
pub fn given() -> bool {
    SOURCE.get().is_some_and(Option::is_some)
}

/// A location read (or saved to in place), with the key given, if any.
pub fn source(loc: Location) -> Result<Location> {
    apply(loc, SOURCE.get().and_then(Option::as_ref))
}

/// The destination of a copy or conversion, with its key, if any.
pub fn destination(loc: Location) -> Result<Location> {
    apply(loc, DESTINATION.get().and_then(Option::as_ref))
}
