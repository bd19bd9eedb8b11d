//! `treepack view`: the viewer (crates/treepack-view) started on the command line.

use anyhow::{Context, Result};
use std::io::Write;
use std::process::ExitCode;
use treepack::StorageOptions;

/// Show a tree, the diff of two trees or a repository's history in the browser.
///
/// The page shows the structure, every leaf, arrays as line plots, heatmaps and histograms;
/// with OTHER, what differs between the two trees; for a repository, its trees over time. It is
/// served on 127.0.0.1 only, on a random port, with a random token in the URL (docs/view.md).
#[derive(clap::Args)]
pub struct ViewArgs {
    /// A tree (directory, .tpk, s3://…, LOCATION@NAME, a .pt / safetensors checkpoint, a folder
    /// of shards) or a repository.
    location: String,
    /// A second tree to compare LOCATION with.
    other: Option<String>,
    /// Listen on this port (default: one the system picks).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Print the URL without opening a browser.
    #[arg(long)]
    no_browser: bool,
}

pub fn run(args: ViewArgs, so: &StorageOptions) -> Result<ExitCode> {
    let opts = treepack_view::ViewOptions { port: args.port, storage: so.clone() };
    let what = match &args.other {
        Some(o) => format!("`{}` and `{o}`", args.location),
        None => format!("`{}`", args.location),
    };
    let mut server = treepack_view::start(&args.location, args.other.as_deref(), &opts)
        .with_context(|| format!("cannot view {what}"))?;
    // A server outlives whoever reads its first line (`treepack view x | head -1`, a script
    // that took the URL): a closed stdout must not end it, as SIGPIPE would (main restores
    // SIGPIPE's default for the listing commands).
    #[cfg(unix)]
    // SAFETY: changing a signal's disposition; the handler is the kernel's "ignore".
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "treepack view: {what} at {}", server.url());
    let _ =
        writeln!(out, "(the URL's token is what opens it: share it only with whom may read the tree; Ctrl-C stops)");
    // Scripts read the URL from a pipe: it must leave now, not when the buffer fills.
    let _ = out.flush();
    if !args.no_browser {
        if let Err(e) = server.open_browser() {
            eprintln!("treepack view: could not open a browser ({e}); open the URL above");
        }
    }
    server.wait();
    Ok(ExitCode::SUCCESS)
}
