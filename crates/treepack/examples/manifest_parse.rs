//! Profiling aid for the load of a big manifest (W11 in bench/, issue 34): times the one-pass
//! parse onto tapes (what the parse helper of a Python load does, `build_streamed`) against
//! serde_json skipping the same text (`IgnoredAny`: the tokenizer alone), minimum of N runs.
//! `perf record` this in release:
//!
//!     cargo run --release --example manifest_parse -- PATH/treepack.json [RUNS] [tape-only]
use std::time::Instant;
use treepack::format::manifest::*;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: manifest_parse PATH/treepack.json [RUNS] [tape-only]")?;
    let runs: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let tape_only = args.next().is_some();
    let bytes = std::fs::read(&path)?;
    let text = std::str::from_utf8(&bytes)?;
    let (mut tape, mut skip) = (f64::MAX, f64::MAX);
    for _ in 0..runs {
        let t = Instant::now();
        let hand_over = |t: Tape| Ok(t.cleared());
        let b = TapeBuilder::<false>::streaming(4096, &hand_over);
        build_one_thread(&bytes, "m", &b)?;
        tape = tape.min(t.elapsed().as_secs_f64() * 1e3);
        drop(b);
        if tape_only {
            continue;
        }
        let t = Instant::now();
        let _: serde::de::IgnoredAny = serde_json::from_str(text)?;
        skip = skip.min(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("min ms: onto tapes {tape:.2}, tokenizer alone {skip:.2}");
    Ok(())
}
