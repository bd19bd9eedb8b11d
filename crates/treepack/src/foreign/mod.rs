//! Checkpoints of other tools, read as trees without running their code (issue 54).
//!
//! [`torch`] reads `torch.save` files (`.pt`, `.pth`, `pytorch_model.bin`) through the pickle
//! reader of [`format::pickle`](crate::format::pickle), which interprets pickles as data and
//! never imports or calls anything. A local file [`torch::is_checkpoint`] recognises is
//! read as the tree it holds wherever a location is parsed ([`crate::Location::parse`]: load,
//! open, structure, the CLI's reading commands, convert), and
//! [`crate::convert::detect_format`] names it `torch`. [`sharded`] reads a folder of
//! Hugging Face shards and their index (safetensors or torch) as one flat tree. [`gguf`] reads
//! llama.cpp's GGUF model files (their header parsed by [`format::gguf`](crate::format::gguf))
//! as a flat dict of tensors, quantized ones as their bytes, with the key-value pairs as the
//! tree's metadata.

pub mod dcp;
pub mod gguf;
pub mod sharded;
pub mod torch;

use crate::{Error, Result};
use bytes::Bytes;
use std::fs::File;
use std::path::Path;

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io { path: path.to_path_buf(), source: e }
}

/// The bytes of the regular file at `path`, opened without following a link: a private
/// (copy-on-write) memory map of it, or — where it cannot be mapped — its bytes read into
/// memory. What a checkpoint is read from.
///
/// # Errors
/// [`Error::Link`] for a link, [`Error::NotFound`], [`Error::InvalidForeign`] (`format`) for
/// something that is not a regular file, [`Error::Io`], [`Error::OutOfMemory`].
pub(crate) fn map_file(path: &Path, format: &str) -> Result<Bytes> {
    let file = open_nofollow(path)?;
    let meta = file.metadata().map_err(io_err(path))?;
    if !meta.is_file() {
        return Err(Error::InvalidForeign {
            file: path.display().to_string(),
            format: format.into(),
            reason: "not a regular file".into(),
        });
    }
    let len = meta.len();
    // SAFETY: a private (copy-on-write) mapping of the file opened above; like every mmap
    // reader, it assumes no other process truncates the file while it is read.
    if let Ok(m) = unsafe { memmap2::MmapOptions::new().map_copy(&file) } {
        if m.len() as u64 == len {
            return Ok(Bytes::from_owner(m));
        }
    }
    let n = usize::try_from(len).map_err(|_| Error::OutOfMemory { key: path.display().to_string(), bytes: len })?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n).map_err(|_| Error::OutOfMemory { key: path.display().to_string(), bytes: len })?;
    buf.resize(n, 0);
    let got = read_at(&file, &mut buf, 0, path, len)?;
    buf.truncate(got);
    Ok(Bytes::from(buf))
}

/// Open `path` for reading, refusing a symbolic link (the file given is the only one read).
fn open_nofollow(path: &Path) -> Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    }
    match o.open(path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::NotFound { location: path.display().to_string(), detail: "no such file".into() })
        }
        Err(e) if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) => {
            let _ = e;
            Err(Error::Link { path: path.to_path_buf(), fix: "give the file itself, not a link to it".into() })
        }
        Err(e) => Err(Error::Io { path: path.to_path_buf(), source: e }),
    }
}

/// Read into `buf` from `offset`, as much as the file has (fewer bytes only at its end).
fn read_at(file: &File, buf: &mut [u8], offset: u64, path: &Path, len: u64) -> Result<usize> {
    let want = (buf.len() as u64).min(len.saturating_sub(offset)) as usize;
    let buf = &mut buf[..want];
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Io { path: path.to_path_buf(), source: e }),
            }
        }
        Ok(done)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::Start(offset)).map_err(io_err(path))?;
        let mut done = 0;
        while done < buf.len() {
            match f.read(&mut buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Io { path: path.to_path_buf(), source: e }),
            }
        }
        Ok(done)
    }
}
