//! `treepack`: inspect, list, print, hash, diff, verify, copy, convert and clean stored trees; manage
//! repositories; write a demo tree.

mod keys;
mod python;
mod show;
mod signing;
mod view;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::json;
use show::{entry_summary, human_bytes};
use std::process::ExitCode;
use treepack::format::manifest::Entry;
use treepack::{LoadOptions, Location, Place, ProgressFn, Reader, SaveOptions, StorageOptions, Tree};

/// mimalloc: trees of many small leaves are allocation-bound, and mimalloc serves their many
/// small allocations faster than glibc malloc does (crates/treepack/examples/
/// profile_small_leaves.rs; bench/RESULTS.md, "Measurements cited by code comments"). Big
/// buffers (2 MiB and more) get huge-page mappings of their own (`treepack_alloc`).
#[global_allocator]
static GLOBAL: treepack_alloc::BigMapped<mimalloc::MiMalloc> = treepack_alloc::BigMapped(mimalloc::MiMalloc);

#[derive(Parser)]
#[command(name = "treepack", version, about = "Save, inspect and load trees of arrays, scalars and strings")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Storage option for remote locations, KEY=VALUE (repeatable): credentials, `region`,
    /// `endpoint`, or tuning such as `max_concurrency`. Environment variables (AWS_*, GOOGLE_*,
    /// AZURE_*) are read too; these override them.
    #[arg(short = 'o', long = "storage-option", value_name = "KEY=VALUE", global = true)]
    storage_options: Vec<String>,
    #[command(flatten)]
    keys: keys::KeyArgs,
}

/// How much of a tree `inspect` prints (not `--json`, which prints everything).
#[derive(clap::Args, Clone, Copy)]
struct View {
    /// Show this many levels below the root shown (0: the root line only); default: all.
    #[arg(long, value_name = "N")]
    depth: Option<usize>,
    /// Print at most this many lines of the tree, then a line saying how many more there are
    /// (0: all).
    #[arg(long, value_name = "N", default_value_t = 200)]
    max_lines: usize,
    /// Cut a node's data and the metadata to this many characters, marked `…` (0: whole).
    #[arg(long, value_name = "N", default_value_t = 120)]
    width: usize,
}

impl View {
    const ALL: View = View { depth: None, max_lines: 0, width: 0 };
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the tree: types, dtypes, shapes, sizes and totals (reads only the manifest).
    Inspect {
        /// A directory, a .tpk file, s3://…, gs://…, az://…, http(s)://…, file://… or memory://…
        path: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Show the subtree at this key path only.
        #[arg(long)]
        key: Option<String>,
        #[command(flatten)]
        view: View,
    },
    /// List leaves, one per line: key path, kind, dtype/shape, size. Optional globs filter.
    Ls {
        path: String,
        /// Key-path globs (`params/**`, `layers/*/w`).
        patterns: Vec<String>,
    },
    /// Print a value: `treepack cat ckpt 'params/w[0:2, :]'` (numpy-style slice, only those chunks are read).
    Cat {
        path: String,
        key: String,
    },
    /// Re-hash every chunk; name corrupt ones and exit non-zero if any. --signed-by first
    /// checks the tree's signature (before any data is read).
    Verify {
        path: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        signed: signing::SignedByArgs,
    },
    /// Sign the tree's root hash, format version and metadata with a private key: its signature
    /// goes beside it (docs/signing.md). Reads only the manifest.
    Sign(signing::SignArgs),
    /// Make a key pair to sign with: KEY.pem (private) and KEY.pub.pem (public).
    Keygen(signing::KeygenArgs),
    /// Print the tree's root hash (docs/format.md section 9), from the manifest alone: the same
    /// whether the tree is a directory, a .tpk, compressed or not. `--key` prints a subtree's.
    Hash {
        path: String,
        /// Hash the subtree at this key path instead.
        #[arg(long)]
        key: Option<String>,
    },
    /// Convert between treepack and safetensors, or from a torch.save checkpoint (read without
    /// pickle); a source by its content, a destination by its extension, or --from/--to. A flat
    /// file's names are read as stored unless --separator splits them into nested keys; nested
    /// keys written to a flat file join with --separator ("." where none is given).
    Convert {
        src: String,
        dst: String,
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value = "")]
        separator: String,
        /// Convert only what this key-path glob selects (repeatable; the syntax and meaning of
        /// `load(select=)`: a leading `?` marks a pattern that may match nothing). What is not
        /// selected is left out.
        #[arg(long = "select", value_name = "GLOB")]
        select: Vec<String>,
        #[command(flatten)]
        out: WriteArgs,
    },
    /// Write a tree as one JSON transport document (docs/transport.md): its manifest as stored,
    /// its chunk bytes as base85 (or base64). To a file with --output, else to stdout. A `.json`
    /// document is itself a location: `treepack ls doc.json`, `treepack.load("doc.json")`.
    Export {
        src: String,
        /// The JSON transport form (the only one; accepted for clarity).
        #[arg(long)]
        json: bool,
        /// How chunk bytes are written: base85 (25 % larger than the bytes) or base64 (33 %).
        #[arg(long, default_value = "base85")]
        encoding: String,
        /// Re-encode chunks under this compression policy first (default: as stored).
        #[arg(long)]
        compression: Option<String>,
        /// Write the document here instead of stdout.
        #[arg(long)]
        output: Option<String>,
        /// Replace an existing output file.
        #[arg(long)]
        overwrite: bool,
    },
    /// Store the tree of a JSON transport document (a file, or - for stdin) at DST.
    Import {
        doc: String,
        dst: String,
        #[command(flatten)]
        out: WriteArgs,
    },
    /// Print the JSON Schema (2020-12) of a tree's type: containers, key names, leaf kinds,
    /// dtypes and ranks; it validates the tree's transport document (and any tree of the same type).
    Schema {
        path: String,
    },
    /// What differs between two trees (key paths, dtypes, shapes, chunks by hash; no array data
    /// read). Exit status 0 when identical, 1 when different, 2 on error (as `diff`).
    Diff {
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Write an example tree with every leaf kind to DIR, inspect it, load it back and check it.
    Demo {
        dir: String,
        #[arg(long)]
        overwrite: bool,
    },
    /// Copy a tree between locations (e.g. a local checkpoint to S3), verifying every chunk on
    /// the way, optionally under a new compression policy (`treepack recompress SRC DST
    /// --compression auto`); shows progress bars on a terminal.
    #[command(visible_alias = "recompress")]
    Cp {
        src: String,
        dst: String,
        #[command(flatten)]
        out: WriteArgs,
    },
    /// Repositories: many named trees sharing chunks (`LOCATION@NAME` names one tree of a
    /// repository wherever a location is taken: inspect, ls, cat, hash, verify, cp).
    #[command(subcommand)]
    Repo(RepoCmd),
    View(view::ViewArgs),
    /// Remove leftovers of interrupted saves (unreferenced packs, staging files).
    Gc {
        path: String,
        /// Keep leftovers younger than this many seconds (a save may still be running).
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
    },
}

/// How the commands that write a tree (`cp`, `convert`, `repo save-from`) write it.
#[derive(clap::Args)]
struct WriteArgs {
    /// Replace what is already at the destination.
    #[arg(long)]
    overwrite: bool,
    /// Compression policy of a treepack destination: none, auto, zstd, zstd:LEVEL, lz4, or a JSON
    /// list of rules (docs/compression.md). Default: none.
    #[arg(long, default_value = "none")]
    compression: String,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Subcommand)]
enum RepoCmd {
    /// Create a repository (a folder or an object-store prefix).
    Init { location: String },
    /// List the names: save time, root hash, bytes written and bytes reused by its save.
    Ls {
        location: String,
        #[arg(long)]
        json: bool,
    },
    /// Copy the tree at SRC into the repository as NAME (only chunks it lacks are written).
    SaveFrom {
        location: String,
        name: String,
        src: String,
        #[command(flatten)]
        out: WriteArgs,
    },
    /// Delete a name (its chunks go at the next gc that finds no other tree using them).
    Rm { location: String, name: String },
    /// Remove packs and manifests no name needs, unreferenced for at least --grace-secs.
    Gc {
        location: String,
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
    },
    /// Re-hash every chunk of every tree and check every pack index.
    Verify { location: String },
}

fn main() -> ExitCode {
    // `treepack ls big | head` must end quietly when `head` stops reading, as Unix tools do;
    // Rust ignores SIGPIPE, and the next print would panic on the broken pipe instead.
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("treepack: error: {}", error_text(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and the causes its own text does not already hold: anyhow's `{:#}` appends every
/// link, and treepack's errors carry their causes in their text (a storage error's reason).
fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let t = cause.to_string();
        if !t.is_empty() && !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
    }
    // What to do, where the core's error leaves it to the caller (a damaged chunk).
    if let Some(hint) = e.chain().find_map(|c| c.downcast_ref::<treepack::Error>()).and_then(|t| t.hint()) {
        text.push_str("; ");
        text.push_str(hint);
    }
    text
}

fn run(cli: Cli) -> Result<ExitCode> {
    let mut so = StorageOptions::new();
    for kv in &cli.storage_options {
        let Some((k, v)) = kv.split_once('=') else { bail!("storage option `{kv}` must look like KEY=VALUE") };
        so.insert(k.trim().to_string(), v.to_string());
    }
    let so = &so;
    keys::install(&cli.keys)?;
    if let Some(done) = python::run_owned(&cli.cmd, !so.is_empty() || keys::given()) {
        return done;
    }
    match cli.cmd {
        Cmd::Inspect { path, json, key, view } => inspect(&path, so, json, key.as_deref(), view),
        Cmd::Ls { path, patterns } => ls(&path, so, &patterns),
        Cmd::Cat { path, key } => cat(&path, so, &key),
        Cmd::Verify { path, json, signed } => signing::verify(&path, so, json, &signed),
        Cmd::Sign(a) => signing::sign_cmd(a, so),
        Cmd::Keygen(a) => signing::keygen(a),
        Cmd::Convert { src, dst, from, to, separator, select, out: WriteArgs { overwrite, compression, quiet } } => {
            use treepack::convert::{ConvertOptions, Format};
            let (f, t) = (Format::of_source(&src, from.as_deref())?, Format::of(&dst, to.as_deref())?);
            let compression = treepack::save::Compression::parse(&compression)?;
            let (bar, progress) = progress_bar("convert", quiet);
            let save = SaveOptions { overwrite, compression, progress: Some(progress), ..Default::default() };
            let opts = ConvertOptions { separator: (!separator.is_empty()).then_some(separator), select, save };
            // A key applies to the treepack side(s) of a conversion.
            let (s, d) = (Location::parse_with(&src, so)?, Location::parse_with(&dst, so)?);
            let s = if f == Format::Treepack { keys::source(s)? } else { s };
            let d = if t == Format::Treepack { keys::destination(d)? } else { d };
            let info = treepack::convert::convert(&s, &d, f, t, &opts)
                .with_context(|| format!("converting {src} to {dst}"))?;
            bar.finish_and_clear();
            println!("converted {} tensors ({}) from {src} to {dst}", info.tensors, human_bytes(info.bytes));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Diff { a, b, json } => {
            let d = treepack::diff(location(&a, so)?, location(&b, so)?)?;
            if json {
                let v: Vec<_> = d.iter().map(|x| x.to_json()).collect();
                println!("{}", serde_json::to_string_pretty(&json!({"identical": d.is_empty(), "changes": v}))?);
            } else {
                for x in &d {
                    println!("{}", x.line());
                }
                let count = |op: char| d.iter().filter(|x| x.op == op).count();
                if d.is_empty() {
                    println!("identical");
                } else {
                    println!("{} added, {} removed, {} changed", count('+'), count('-'), count('~'));
                }
            }
            Ok(if d.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Cmd::Hash { path, key } => {
            let r = open(&path, so)?;
            let h = match key {
                None => r.root_hash(),
                Some(k) => treepack::format::merkle::node_hash(treepack::format::keypath::resolve_place(
                    &r.manifest().root,
                    &k,
                )?),
            };
            println!("{}", h.to_hex());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Export { src, json: _, encoding, compression, output, overwrite } => {
            export(&src, so, &encoding, compression.as_deref(), output.as_deref(), overwrite)
        }
        Cmd::Import { doc, dst, out } => import(&doc, &dst, so, &out),
        Cmd::Schema { path } => {
            println!("{}", treepack::transport::schema(location(&path, so)?)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Demo { dir, overwrite } => demo(&dir, so, overwrite),
        Cmd::Cp { src, dst, out } => copy(&src, &dst, so, &out),
        Cmd::Repo(cmd) => repo(cmd, so),
        Cmd::View(args) => {
            if keys::given() {
                bail!("treepack view does not open encrypted trees yet (docs/encryption.md): inspect it with `treepack inspect`, `ls` and `cat`, or view a decrypted copy (`treepack cp SRC COPY --encryption-key KEY --decrypt`)");
            }
            view::run(args, so)
        }
        Cmd::Gc { path, grace_secs } => {
            let r = treepack::gc(location(&path, so)?, std::time::Duration::from_secs(grace_secs))?;
            for p in &r.removed {
                println!("removed {p}");
            }
            for p in &r.kept_recent {
                println!("kept (younger than {grace_secs}s) {p}");
            }
            println!("{} removed, {} freed", r.removed.len(), human_bytes(r.bytes_freed));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn repo(cmd: RepoCmd, so: &StorageOptions) -> Result<ExitCode> {
    let open_repo = |l: &str| -> Result<treepack::Repository> { Ok(treepack::Repository::open(location(l, so)?)?) };
    match cmd {
        RepoCmd::Init { location: l } => {
            treepack::Repository::create(location(&l, so)?)?;
            println!(
                "repository ready at {l}; save into it with `treepack repo save-from {l} NAME SRC` or to {l}@NAME"
            );
        }
        RepoCmd::Ls { location: l, json } => {
            let names = open_repo(&l)?.names()?;
            if json {
                let v: Vec<_> = names
                    .iter()
                    .map(|t| json!({"name": t.name, "root": t.root.to_hex(), "saved_ms": t.saved_ms, "bytes_written": t.bytes_written, "bytes_reused": t.bytes_reused}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for t in &names {
                    println!(
                        "{}  {}  {}  written {}, reused {}",
                        t.name,
                        show::utc_time(t.saved_ms),
                        &t.root.to_hex()[..16],
                        human_bytes(t.bytes_written),
                        human_bytes(t.bytes_reused)
                    );
                }
                println!("{} tree{}", names.len(), if names.len() == 1 { "" } else { "s" });
            }
        }
        RepoCmd::SaveFrom { location: l, name, src, out } => {
            let dst = open_repo(&l)?.tree(&name)?.display().to_string();
            return copy(&src, &dst, so, &out);
        }
        RepoCmd::Rm { location: l, name } => {
            open_repo(&l)?.delete(&name)?;
            println!("deleted {l}@{name}; `treepack repo gc {l}` frees what no other tree uses");
        }
        RepoCmd::Gc { location: l, grace_secs } => {
            let r = open_repo(&l)?.gc(std::time::Duration::from_secs(grace_secs))?;
            for p in &r.removed {
                println!("removed {p}");
            }
            if r.saves_running > 0 {
                println!("{} save(s) running: nothing deleted this time", r.saves_running);
            }
            println!(
                "{} removed, {} freed, {} unreferenced kept (younger than {grace_secs}s, or saves running)",
                r.removed.len(),
                human_bytes(r.bytes_freed),
                r.waiting.len()
            );
        }
        RepoCmd::Verify { location: l } => {
            let rep = open_repo(&l)?.verify()?;
            for p in &rep.problems {
                println!("CORRUPT {} {}: {}", p.file, p.key, p.reason);
            }
            print_verify_summary(&rep);
            return Ok(if rep.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The last line of `verify` and `repo verify`: OK or FAILED, what was checked, problems.
pub(crate) fn print_verify_summary(rep: &treepack::VerifyReport) {
    println!(
        "{}: {} chunks, {} checked, {} problem{}",
        if rep.ok() { "OK" } else { "FAILED" },
        rep.chunks_checked,
        human_bytes(rep.bytes_checked),
        rep.problems.len(),
        if rep.problems.len() == 1 { "" } else { "s" }
    );
}

fn location(path: &str, so: &StorageOptions) -> Result<Location> {
    keys::source(Location::parse_with(path, so)?)
}

/// The destination of a copy or import: with its own key (`--dst-encryption-key`), the source's
/// by default, none with `--decrypt`.
fn dst_location(path: &str, so: &StorageOptions) -> Result<Location> {
    keys::destination(Location::parse_with(path, so)?)
}

pub(crate) fn open(path: &str, so: &StorageOptions) -> Result<Reader> {
    treepack::open(location(path, so)?).with_context(|| format!("cannot open `{path}`"))
}

/// A byte-progress bar on stderr (hidden when stderr is not a terminal or `quiet`).
fn progress_bar(label: &str, quiet: bool) -> (indicatif::ProgressBar, ProgressFn) {
    let bar = if quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(0) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(label.to_string());
    let b = bar.clone();
    let f = ProgressFn::new(move |done, total| {
        b.set_length(total);
        b.set_position(done);
    });
    (bar, f)
}

fn copy(src: &str, dst: &str, so: &StorageOptions, out: &WriteArgs) -> Result<ExitCode> {
    // A bad policy is refused before anything is read.
    let WriteArgs { overwrite, ref compression, quiet } = *out;
    let compression = treepack::save::Compression::parse(compression)?;
    let r = open(src, so)?;
    let (bar, f) = progress_bar("read", quiet);
    let mut tree = r.load(&LoadOptions { progress: Some(f), ..Default::default() })?;
    bar.finish_and_clear();
    // The copy keeps every array's chunk grid, so it has the source's root hash.
    treepack::save::keep_chunk_shapes(&mut tree, &r.manifest().root);
    let m = r.manifest();
    let (bar, f) = progress_bar("write", quiet);
    let opts =
        SaveOptions { overwrite, metadata: m.metadata.clone(), progress: Some(f), compression, ..Default::default() };
    let info = treepack::save(&tree, dst_location(dst, so)?, &opts).with_context(|| format!("saving to `{dst}`"))?;
    bar.finish_and_clear();
    let (canonical, stored) = chunk_totals(&treepack::Reader::open(dst_location(dst, so)?)?.manifest().root);
    println!(
        "copied {} leaves ({} of array data) from {src} to {dst}: {} written in {} pack(s); chunks {} -> {} ({})",
        info.leaves,
        human_bytes(info.array_bytes),
        human_bytes(info.bytes_written),
        info.packs,
        human_bytes(canonical),
        human_bytes(stored),
        show::ratio(canonical, stored)
    );
    if let Some(root) = info.root {
        println!("{} already in the repository, reused; root {}", human_bytes(info.bytes_reused), root.to_hex());
    }
    signing::carry(src, dst, so)?.iter().for_each(|l| println!("{l}"));
    Ok(ExitCode::SUCCESS)
}

fn export(
    src: &str,
    so: &StorageOptions,
    encoding: &str,
    compression: Option<&str>,
    output: Option<&str>,
    overwrite: bool,
) -> Result<ExitCode> {
    use treepack::transport::{Encoding, ExportOptions};
    let encoding = Encoding::from_name(encoding)
        .ok_or_else(|| anyhow::anyhow!("unknown --encoding {encoding:?}: use base85 or base64"))?;
    let compression = compression.map(treepack::save::Compression::parse).transpose()?;
    if let Some(out) = output {
        if !overwrite && std::path::Path::new(out).exists() {
            anyhow::bail!("{out} already exists; pass --overwrite to replace it");
        }
    }
    let doc = treepack::transport::export(location(src, so)?, &ExportOptions { encoding, compression })
        .with_context(|| format!("cannot export `{src}`"))?;
    match output {
        Some(out) => {
            std::fs::write(out, &doc).with_context(|| format!("cannot write {out}"))?;
            eprintln!("wrote {out}: {}", human_bytes(doc.len() as u64));
        }
        None => {
            use std::io::Write;
            std::io::stdout().lock().write_all(doc.as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn import(doc: &str, dst: &str, so: &StorageOptions, out: &WriteArgs) -> Result<ExitCode> {
    let WriteArgs { overwrite, ref compression, quiet: _ } = *out;
    let compression = treepack::save::Compression::parse(compression)?;
    let bytes = if doc == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut b)?;
        b
    } else {
        std::fs::read(doc).with_context(|| format!("cannot read {doc}"))?
    };
    let opts = SaveOptions { overwrite, compression, ..Default::default() };
    let info = treepack::transport::import(&bytes, dst_location(dst, so)?, &opts)
        .with_context(|| format!("cannot import {doc} into `{dst}`"))?;
    println!(
        "imported {} leaves ({} of array data) from {doc} to {dst}: {} written in {} pack(s)",
        info.leaves,
        human_bytes(info.array_bytes),
        human_bytes(info.bytes_written),
        info.packs
    );
    Ok(ExitCode::SUCCESS)
}

/// (canonical, stored) bytes of the stored chunks under `node` (a chunk several leaves share
/// counted once): what compression saved.
fn chunk_totals(node: &Tree<Entry>) -> (u64, u64) {
    let mut seen = std::collections::HashSet::new();
    let (mut canonical, mut stored) = (0, 0);
    node.for_each_leaf(&mut |_, e| {
        for (i, c) in e.chunks().iter().enumerate() {
            if seen.insert((c.pack, c.offset)) {
                canonical += e.chunk_canonical(i).0;
                stored += c.length;
            }
        }
    });
    (canonical, stored)
}

struct Totals {
    leaves: usize,
    arrays: usize,
    array_bytes: u64,
}

fn inspect(path: &str, so: &StorageOptions, as_json: bool, key: Option<&str>, view: View) -> Result<ExitCode> {
    let r = open(path, so)?;
    let m = r.manifest();
    let node = r.entry(key.unwrap_or(""))?;
    let mut t = Totals { leaves: 0, arrays: 0, array_bytes: 0 };
    node.for_each_leaf(&mut |_, e| {
        t.leaves += 1;
        if let Entry::Array(a) = e {
            t.arrays += 1;
            t.array_bytes += a.nbytes();
        }
    });
    let stored: u64 = m.packs.iter().map(|p| p.size).sum();
    let chunks = chunk_totals(node);
    let (signature_line, signature) = signing::inspect(&r);
    if as_json {
        let mut leaves = vec![];
        node.for_each_leaf(&mut |p, e| {
            let mut o = json!({"path": p.to_string(), "kind": e.kind(), "nbytes": e.nbytes()});
            if !e.chunks().is_empty() {
                let mut codecs: Vec<&str> = e.chunks().iter().map(|c| c.codec.name()).collect();
                codecs.sort_unstable();
                codecs.dedup();
                o["codecs"] = json!(codecs);
                o["stored_bytes"] = json!(e.chunks().iter().map(|c| c.length).sum::<u64>());
            }
            if let Entry::Array(a) = e {
                o["dtype"] = a.dtype.to_json();
                o["shape"] = json!(a.shape);
                o["chunks"] = json!(e.chunks().len());
                if let Some(v) = &a.annotation {
                    o["as"] = v.clone();
                }
                if let Some(p) = &a.preview {
                    o["preview"] = p.clone();
                }
            }
            leaves.push(o);
        });
        // The other places of shared objects, with the place each stands for.
        let targets = Targets::of(&m.root);
        let mut refs = vec![];
        node.for_each_place(&mut |p, place| {
            if let Place::Ref(id) = place {
                refs.push(json!({"path": path_text(p), "shared": id, "target": targets.0.get(&id)}));
            }
        });
        let out = json!({
            "location": path, "layout": format!("{:?}", r.location().layout()).to_lowercase(), "read_from": r.location().read_from(),
            "version": [m.version.0, m.version.1], "writer": m.writer, "metadata": m.metadata,
            "leaves": leaves, "refs": refs, "signature": signature, "encrypted": r.location().is_encrypted(),
            "encrypted_with": r.location().encrypted_with(),
            "totals": {"leaves": t.leaves, "arrays": t.arrays, "array_bytes": t.array_bytes, "stored_bytes": stored, "packs": m.packs.len(),
                       "chunk_bytes": chunks.0, "chunk_stored_bytes": chunks.1},
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(kind) = r.location().read_from() {
        // The tree of another tool's file: its own layout and writer are not treepack's.
        println!("{path}  ({kind}, read as a tree without running its code)");
    } else {
        println!(
            "{path}  ({}{}, format {}.{}, {} pack{}, {} stored, written by {})",
            format!("{:?}", r.location().layout()).to_lowercase(),
            r.location().encrypted_with().map(|w| format!(", encrypted with {w}")).unwrap_or_default(),
            m.version.0,
            m.version.1,
            m.packs.len(),
            if m.packs.len() == 1 { "" } else { "s" },
            human_bytes(stored),
            m.writer
        );
    }
    let targets = Targets::of(&m.root);
    let mut out = Render::new(&targets, view);
    if let Some(md) = &m.metadata {
        println!("metadata: {}", out.cut(&md.to_string()));
    }
    signature_line.iter().for_each(|l| println!("{l}"));
    out.node(node, key.unwrap_or("<root>").to_string(), "", true, true, 0);
    for l in &out.lines {
        println!("{l}");
    }
    for note in out.notes(path) {
        println!("{note}");
    }
    println!(
        "totals: {} leaves, {} arrays, {} of array data, {} stored",
        t.leaves,
        t.arrays,
        human_bytes(t.array_bytes),
        human_bytes(stored)
    );
    if chunks.0 != chunks.1 {
        println!(
            "compression: chunks {} -> {} stored ({})",
            human_bytes(chunks.0),
            human_bytes(chunks.1),
            show::ratio(chunks.0, chunks.1)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Where each shared object is first held (key paths from the root), to show a ref as the
/// place it stands for.
struct Targets(std::collections::HashMap<u64, String>);

impl Targets {
    fn of(root: &Tree<Entry>) -> Targets {
        Targets(root.shared_paths().into_iter().map(|(id, p)| (id, path_text(&p))).collect())
    }
    fn ref_text(&self, id: u64) -> String {
        match self.0.get(&id) {
            Some(p) => format!("ref -> {p} (shared #{id}, stored once)"),
            None => format!("ref #{id} (the object shared as #{id}, stored once)"),
        }
    }
}

fn path_text(p: &treepack::format::keypath::KeyPath) -> String {
    if p.is_root() {
        "<root>".to_string()
    } else {
        p.to_string()
    }
}

fn container_label(t: &Tree<Entry>, targets: &Targets, cut: &mut impl FnMut(&str) -> String) -> String {
    match t {
        Tree::List(v) => format!("list[{}]", v.len()),
        Tree::Tuple(v) => format!("tuple[{}]", v.len()),
        Tree::Dict(v) => format!("dict[{}]", v.len()),
        Tree::Record { type_name, fields } => format!("record {type_name} ({} fields)", fields.len()),
        Tree::Custom { type_name, data, children } => {
            let d = if data.is_null() { String::new() } else { format!(" {}", cut(&data.to_string())) };
            format!("custom {type_name}{d} ({} children)", children.len())
        }
        Tree::Leaf(e) => entry_summary(e),
        // An object at several places: its first place says `shared #N`, the others `ref #N`.
        Tree::Shared { id, node } => format!("{} (shared #{id})", container_label(node, targets, cut)),
        Tree::Ref(id) => targets.ref_text(*id),
    }
}

/// `inspect`'s tree lines, within a [`View`]: levels below `depth` are left out (their
/// container's line ends in `…`), lines past `max_lines` are counted, not formatted, and long
/// data is cut to `width`.
struct Render<'a> {
    targets: &'a Targets,
    view: View,
    lines: Vec<String>,
    /// Lines not printed for `max_lines`.
    more: u64,
    /// Whether `depth` left levels out.
    deeper: bool,
    /// Whether some value was cut to `width`.
    cut_any: bool,
}

impl<'a> Render<'a> {
    fn new(targets: &'a Targets, view: View) -> Render<'a> {
        Render { targets, view, lines: vec![], more: 0, deeper: false, cut_any: false }
    }

    /// `s` cut to the view's width, ending in `… (N chars)` when cut.
    fn cut(&mut self, s: &str) -> String {
        let n = s.chars().count();
        if self.view.width == 0 || n <= self.view.width {
            return s.to_string();
        }
        self.cut_any = true;
        format!("{}… ({n} chars)", s.chars().take(self.view.width).collect::<String>())
    }

    fn node(&mut self, t: &Tree<Entry>, name: String, prefix: &str, last: bool, root: bool, level: usize) {
        if self.view.max_lines != 0 && self.lines.len() >= self.view.max_lines {
            self.more += self.count(t, level);
            return;
        }
        let kids = t.children();
        let stop = self.view.depth.is_some_and(|d| level >= d) && !kids.is_empty();
        let (branch, next_prefix) = branches(prefix, last, root);
        let targets = self.targets;
        let mut label = container_label(t, targets, &mut |s| self.cut(s));
        if stop {
            label.push_str("  …");
            self.deeper = true;
        }
        self.lines.push(format!("{branch}{name}: {label}"));
        if stop {
            return;
        }
        let n = kids.len();
        for (i, (step, child)) in kids.into_iter().enumerate() {
            let seg = treepack::format::keypath::Segment::from_step_pub(&step).text();
            self.node(child, seg, &next_prefix, i + 1 == n, false, level + 1);
        }
    }

    /// The lines `t` at `level` would take (it and what the depth lets show below it).
    fn count(&mut self, t: &Tree<Entry>, level: usize) -> u64 {
        let kids = t.children();
        if self.view.depth.is_some_and(|d| level >= d) {
            self.deeper |= !kids.is_empty();
            return 1;
        }
        1 + kids.into_iter().map(|(_, c)| self.count(c, level + 1)).sum::<u64>()
    }

    /// What was left out, and how to see it.
    fn notes(&self, path: &str) -> Vec<String> {
        let mut out = vec![];
        if self.more > 0 {
            out.push(format!(
                "… {} more line{} not shown (--max-lines 0 shows all, --depth N fewer levels, --key PATH one subtree; \
                 treepack ls {path} lists the leaves)",
                self.more,
                if self.more == 1 { "" } else { "s" }
            ));
        }
        if self.deeper {
            if let Some(d) = self.view.depth {
                out.push(format!("(levels below {d} not shown, marked …: leave --depth out to show them all)"));
            }
        }
        if self.cut_any {
            out.push(format!(
                "(values longer than {} characters cut, marked …: --width 0 shows them whole)",
                self.view.width
            ));
        }
        out
    }
}

/// The branch drawn before a node's name and the prefix of its children's lines.
fn branches(prefix: &str, last: bool, root: bool) -> (String, String) {
    if root {
        (String::new(), String::new())
    } else if last {
        (format!("{prefix}└── "), format!("{prefix}    "))
    } else {
        (format!("{prefix}├── "), format!("{prefix}│   "))
    }
}

fn ls(path: &str, so: &StorageOptions, patterns: &[String]) -> Result<ExitCode> {
    let r = open(path, so)?;
    let sel = treepack::format::keypath::Selection::new(patterns)?;
    let mut n = 0;
    let root = &r.manifest().root;
    let targets = Targets::of(root);
    // Refs are listed too (as the place they stand for): a leaf reached through a ref has
    // that key path as well, and a glob may name it.
    root.for_each_place(&mut |p, place| {
        let text = match place {
            Place::Leaf(e) => entry_summary(e),
            Place::Ref(id) => targets.ref_text(id),
            Place::Shared(_) => return,
        };
        if sel.selects(p) {
            n += 1;
            println!("{}\t{text}", path_text(p));
        }
    });
    if n == 0 && !patterns.is_empty() {
        bail!("no leaf matches {}", patterns.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}

/// Split `params/w[0:2, :]` into the key path and the slice text.
fn split_key_slice(key: &str) -> (&str, Option<&str>) {
    if key.ends_with(']') {
        if let Some(i) = key.rfind('[') {
            return (&key[..i], Some(&key[i + 1..key.len() - 1]));
        }
    }
    (key, None)
}

fn cat(path: &str, so: &StorageOptions, key: &str) -> Result<ExitCode> {
    let r = open(path, so)?;
    let (k, slice) = split_key_slice(key);
    match slice {
        Some(s) => {
            let a = r.read_array(k, s).with_context(|| format!("cannot read `{key}` of `{path}`"))?;
            println!("{}{:?} =\n{}", a.dtype().display(), a.shape(), show::format_array(&a));
        }
        None => {
            let n = r.get(k).with_context(|| format!("cannot read `{key}` of `{path}`"))?;
            println!("{}", show::format_node(&n, 0));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn demo(dir: &str, so: &StorageOptions, overwrite: bool) -> Result<ExitCode> {
    let tree = treepack::demo::example_tree();
    let opts = SaveOptions {
        overwrite,
        metadata: Some(json!({"description": "treepack demo tree: every leaf kind and dtype", "step": 1000})),
        chunk_bytes: 128 << 10,
        ..Default::default()
    };
    let info =
        treepack::save(&tree, location(dir, so)?, &opts).with_context(|| format!("saving the demo tree to `{dir}`"))?;
    println!(
        "saved {} leaves ({} arrays, {} of array data) to {dir}: {} chunks ({} unique) in {} pack(s), {} written\n",
        info.leaves,
        info.arrays,
        human_bytes(info.array_bytes),
        info.chunks,
        info.unique_chunks,
        info.packs,
        human_bytes(info.bytes_written)
    );
    inspect(dir, so, false, None, View::ALL)?;
    let back = treepack::load(location(dir, so)?, &LoadOptions::default())?;
    if !back.exact_eq(&tree) {
        bail!("the loaded tree differs from the saved one");
    }
    println!("\nloaded back: identical to what was saved (all chunk hashes verified)");
    let r = open(dir, so)?;
    let part = r.read_array("params/dense/kernel", "0:2, 0:4")?;
    println!("partial read params/dense/kernel[0:2, 0:4] = \n{}", show::format_array(&part));
    println!("\ntry: treepack inspect {dir} | treepack ls {dir} 'params/**' | treepack cat {dir} 'dtypes/record_dtype' | treepack verify {dir}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod error_text_tests {
    use super::error_text;

    #[test]
    fn each_cause_is_printed_once() {
        // A treepack error whose text holds its cause already, under a context: the cause is
        // not repeated; a cause the text lacks is added.
        let io = std::io::Error::other("Connection refused");
        let e = anyhow::Error::new(io).context("s3://b/x: storage error: error sending request: Connection refused");
        let e = e.context("cannot open s3://b/x");
        assert_eq!(
            error_text(&e),
            "cannot open s3://b/x: s3://b/x: storage error: error sending request: Connection refused"
        );
        let e = anyhow::Error::new(std::io::Error::other("disk full")).context("writing t/packs/a.tpp");
        assert_eq!(error_text(&e), "writing t/packs/a.tpp: disk full");
    }
}
