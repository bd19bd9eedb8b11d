//! The on-disk hostile corpus in `tests/hostile/`: crafted locations and files (truncations,
//! wrong lengths, overlapping and out-of-range offsets, giant shapes, deep nesting, duplicate
//! keys, bad UTF-8, NaN where integers belong, escaping pack paths, symlinks, unknown versions
//! and codecs). Each must fail with the error kind listed in `tests/hostile/EXPECTED.tsv`, in
//! under a second, without the process growing by 100 MiB.
//!
//! Regenerate after a deliberate format change: `TREEPACK_BLESS=1 cargo test -p treepack --test hostile`.
//! Crashes found by fuzzing (fuzz/) are added here as further cases.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use treepack::format::hash::Hash32;
use treepack::format::manifest::seal;
use treepack::format::*;
use treepack::*;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile")
}

const DATA: [u8; 16] = [1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0];
const PACKS: &str = "[{\"path\":\"packs/p.tpp\",\"size\":16}]";

fn chunk(pack: u32, offset: u64, data: &[u8]) -> String {
    format!(
        "{{\"pack\":{pack},\"offset\":{offset},\"length\":{},\"codec\":\"raw\",\"blake3\":\"{}\"}}",
        data.len(),
        Hash32::of(data).to_hex()
    )
}

/// A chunk reference with `codec`, storing `stored` for the canonical bytes `canonical`.
fn coded(codec: &str, stored: &[u8], canonical: &[u8]) -> String {
    format!(
        "{{\"pack\":0,\"offset\":0,\"length\":{},\"codec\":\"{codec}\",\"blake3\":\"{}\"}}",
        stored.len(),
        Hash32::of(canonical).to_hex()
    )
}

/// A format 1.1 directory case: one int32[4] array whose only chunk is `stored` with `codec`.
fn coded_case(codec: &str, stored: &[u8], canonical: &[u8]) -> Build {
    let packs = format!("[{{\"path\":\"packs/p.tpp\",\"size\":{}}}]", stored.len());
    sealed(&packs, array_root("[4]", "[4]", &coded(codec, stored, canonical)), Some(stored))
}

fn zstd_frame(data: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(data, 19).unwrap()
}

/// One zstd frame of `n` spaces then `tail`, made a MiB at a time (a test building it whole
/// would raise the process's peak memory, which the corpus test measures).
fn spaces_then(n: usize, tail: &[u8]) -> Vec<u8> {
    spaces_then_with_head(b"", n, tail)
}

fn spaces_then_with_head(head: &[u8], n: usize, tail: &[u8]) -> Vec<u8> {
    use std::io::Write;
    // Level 1: runs of spaces compress to nearly nothing at any level, and a high level's
    // tables would raise the peak memory the corpus test measures.
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    e.write_all(head).unwrap();
    let mib = vec![b' '; 1 << 20];
    for _ in 0..n >> 20 {
        e.write_all(&mib).unwrap();
    }
    e.write_all(tail).unwrap();
    e.finish().unwrap()
}

fn array_root(shape: &str, chunk_shape: &str, chunks: &str) -> String {
    format!("{{\"t\":\"dict\",\"items\":[[\"w\",{{\"t\":\"array\",\"dtype\":\"int32\",\"shape\":{shape},\"chunk_shape\":{chunk_shape},\"chunks\":[{chunks}]}}]]}}")
}

fn body(packs: &str, root: &str) -> Vec<u8> {
    format!(
        "{{\"format\":\"treepack\",\"version\":[1,0],\n\"writer\":\"hostile\",\n\"packs\":{packs},\n\"root\":{root}"
    )
    .into_bytes()
}

/// How a case is laid out on disk.
enum Build {
    /// A directory with this (already sealed or raw) manifest and pack bytes at `packs/p.tpp`.
    Dir { manifest: Vec<u8>, pack: Option<Vec<u8>> },
    /// A directory whose manifest is sealed from `packs`/`root`.
    Sealed { packs: String, root: String, pack: Option<Vec<u8>> },
    /// A single `.tpk` file with these bytes.
    File(Vec<u8>),
    /// Custom: write whatever is needed under the given path.
    Custom(Box<dyn Fn(&Path)>),
}

struct Case {
    name: &'static str,
    kind: &'static str,
    what: &'static str,
    build: Build,
}

fn case(name: &'static str, kind: &'static str, what: &'static str, build: Build) -> Case {
    Case { name, kind, what, build }
}

fn sealed(packs: &str, root: String, pack: Option<&[u8]>) -> Build {
    Build::Sealed { packs: packs.to_string(), root, pack: pack.map(<[u8]>::to_vec) }
}

fn good_root() -> String {
    array_root("[4]", "[4]", &chunk(0, 0, &DATA))
}

fn good_manifest() -> Vec<u8> {
    seal(&body(PACKS, &good_root()))
}

/// A valid single file holding a 100 kB u8 array, for single-file damage.
fn good_tpk() -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.tpk");
    let arr = ArrayData::new(DType::U8, vec![100_000], vec![7u8; 100_000]).unwrap();
    // The writer string is fixed so that the corpus does not change with the crate's version.
    let opts = SaveOptions { writer: "treepack-rs/0.1.0".into(), ..Default::default() };
    save(&Node::dict([("a", Node::from(arr))]), p.to_str().unwrap(), &opts).unwrap();
    std::fs::read(&p).unwrap()
}

/// A transport document (docs/format.md section 11) of the good manifest's tree, with
/// `edit` applied to its manifest body (re-sealed, so the checksum holds) and `data` as its
/// chunk bytes.
fn transport_doc(edit: impl Fn(&str) -> String, data: &[u8]) -> Vec<u8> {
    use treepack::format::transport as form;
    let packs = format!("[{{\"path\":\"{}\",\"size\":16}}]", form::PACK_PATH);
    let body = String::from_utf8(body(&packs, &good_root())).unwrap();
    form::write(&seal(edit(&body).as_bytes()), data, form::Encoding::Base85).into_bytes()
}

/// JSON lists nested 100 000 deep: far past the bound on free JSON values (128), and deep
/// enough to overflow any stack if read by recursing once per level.
fn deep_lists() -> String {
    "[".repeat(100_000) + &"]".repeat(100_000)
}

/// A manifest body (as [`body`] makes it) with a `metadata` member before its packs.
fn with_metadata(body: &[u8], metadata: &str) -> Vec<u8> {
    let body = String::from_utf8(body.to_vec()).unwrap();
    body.replacen("\n\"packs\"", &format!("\n\"metadata\":{metadata},\n\"packs\""), 1).into_bytes()
}

/// The repository folder of a `repo-…@t` case path.
fn repo_dir(p: &Path) -> PathBuf {
    let name = p.file_name().unwrap().to_str().unwrap();
    p.with_file_name(name.split('@').next().unwrap())
}

fn good_ref(manifest: &[u8]) -> Vec<u8> {
    let h = Hash32::of(manifest).to_hex();
    format!(r#"{{"tree":"trees/{h}.json","root":"{h}","saved_ms":1,"bytes_written":0,"bytes_reused":0}}"#).into_bytes()
}

/// A repository holding the good manifest (under its hash, when `with_tree`) and a ref `t`
/// made by `make_ref` from the manifest's bytes.
fn repo_case(make_ref: fn(&[u8]) -> Vec<u8>, with_tree: bool) -> Build {
    Build::Custom(Box::new(move |p: &Path| {
        let dir = repo_dir(p);
        let m = good_manifest();
        for sub in ["refs", "trees", "packs"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("treepack-repo.json"), treepack::format::repo::marker_bytes()).unwrap();
        std::fs::write(dir.join("packs/p.tpp"), DATA).unwrap();
        if with_tree {
            std::fs::write(dir.join(format!("trees/{}.json", Hash32::of(&m).to_hex())), &m).unwrap();
        }
        std::fs::write(dir.join("refs/t.json"), make_ref(&m)).unwrap();
    }))
}

impl Build {
    /// The writer of a `Custom` build.
    fn custom(self) -> Box<dyn Fn(&Path)> {
        match self {
            Build::Custom(f) => f,
            _ => panic!("not a custom build"),
        }
    }
}

/// The key the `encrypted-…` cases are opened with (`encrypted-pw-…`: a passphrase).
const ENC_KEY: [u8; 32] = [7; 32];

fn case_key(name: &str) -> Option<KeySource> {
    if name.starts_with("encrypted-pw-") {
        Some(KeySource::Passphrase("hostile".into()))
    } else if name.starts_with("encrypted-") {
        Some(KeySource::Key(ENC_KEY))
    } else {
        None
    }
}

/// A case's location, with its key when it has one.
fn case_location(name: &str, p: &str) -> Result<Location> {
    let loc = Location::parse(p)?;
    match case_key(name) {
        Some(k) => loc.with_encryption(k),
        None => Ok(loc),
    }
}

/// An encrypted location's files, as the writer makes them (the data key and salt fixed, so
/// the corpus is reproduced byte for byte): 256 KiB of int32 in 64 KiB chunks, so several
/// segments.
fn encrypted_files(single: bool, key: KeySource) -> Vec<(String, Vec<u8>)> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join(if single { "t.tpk" } else { "t" });
    let w: Vec<u8> = (0..65536i32).flat_map(|i| i.to_le_bytes()).collect();
    let tree = Node::dict([("w", Node::from(ArrayData::new(DType::I32, vec![65536], w).unwrap()))]);
    let loc = Location::parse(p.to_str().unwrap()).unwrap().with_fixed_encryption(key, [0x42; 32], [0x24; 32]);
    save(&tree, loc, &SaveOptions { chunk_bytes: 64 << 10, durable: false, ..Default::default() }).unwrap();
    if single {
        return vec![(String::new(), std::fs::read(&p).unwrap())];
    }
    let mut out = vec![("treepack.json".to_string(), std::fs::read(p.join("treepack.json")).unwrap())];
    for e in std::fs::read_dir(p.join("packs")).unwrap() {
        let e = e.unwrap();
        out.push((format!("packs/{}", e.file_name().to_string_lossy()), std::fs::read(e.path()).unwrap()));
    }
    out
}

/// `obj` (an encrypted object) with its envelope replaced by `f(envelope)`.
fn with_envelope(obj: &[u8], f: impl Fn(&str) -> String) -> Vec<u8> {
    let n = obj.len();
    let e = u32::from_le_bytes(obj[n - 16..n - 12].try_into().unwrap()) as usize;
    let env = std::str::from_utf8(&obj[n - 16 - e..n - 16]).unwrap();
    let new = f(env);
    let mut out = obj[..n - 16 - e].to_vec();
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&(new.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(b"TPKCRYPT");
    out
}

/// An encrypted directory whose files `edit` changes (path, bytes) before they are written.
fn encrypted_dir_case(edit: fn(&str, &mut Vec<u8>)) -> Build {
    Build::Custom(Box::new(move |p: &Path| {
        std::fs::create_dir_all(p.join("packs")).unwrap();
        for (rel, mut b) in encrypted_files(false, KeySource::Key(ENC_KEY)) {
            edit(&rel, &mut b);
            std::fs::write(p.join(rel), b).unwrap();
        }
    }))
}

fn encrypted_cases() -> Vec<Case> {
    let tpk = encrypted_files(true, KeySource::Key(ENC_KEY)).remove(0).1;
    let pw = encrypted_files(true, KeySource::Passphrase("hostile".into())).remove(0).1;
    let n = tpk.len();
    let seg = (64 << 10) + 16;
    let env_len = u32::from_le_bytes(tpk[n - 16..n - 12].try_into().unwrap()) as usize;
    let tail = tpk[n - 16 - env_len..].to_vec();
    vec![
        case(
            "encrypted-trailer-huge-envelope.tpk",
            "tampered",
            "a trailer declaring a 1 GiB envelope",
            Build::File({
                let mut b = tpk.clone();
                b[n - 16..n - 12].copy_from_slice(&(1u32 << 30).to_le_bytes());
                b
            }),
        ),
        case(
            "encrypted-envelope-not-json.tpk",
            "wrong_key",
            "an envelope that is not JSON",
            Build::File(with_envelope(&tpk, |_| "{not json".into())),
        ),
        case(
            "encrypted-envelope-deep.tpk",
            "wrong_key",
            "an envelope of 10 000 nested lists",
            Build::File(with_envelope(&tpk, |_| "[".repeat(10_000))),
        ),
        case(
            "encrypted-envelope-segment-tiny.tpk",
            "wrong_key",
            "an envelope saying 1-byte segments",
            Build::File(with_envelope(&tpk, |e| e.replace("\"segment_bytes\":65536", "\"segment_bytes\":1"))),
        ),
        case(
            "encrypted-envelope-segment-other.tpk",
            "wrong_key",
            "an envelope saying 4 KiB segments (the wrapped key binds the size)",
            Build::File(with_envelope(&tpk, |e| e.replace("\"segment_bytes\":65536", "\"segment_bytes\":4096"))),
        ),
        case(
            "encrypted-envelope-data-key-short.tpk",
            "wrong_key",
            "a wrapped data key of one byte",
            Build::File(with_envelope(&tpk, |e| {
                let at = e.find("\"data_key\":\"").unwrap() + 12;
                format!("{}00\"}}", &e[..at])
            })),
        ),
        case(
            "encrypted-envelope-unknown-kind.tpk",
            "wrong_key",
            "a key kind no treepack has",
            Build::File(with_envelope(&tpk, |e| e.replace("\"kind\":\"key\"", "\"kind\":\"rot13\""))),
        ),
        case(
            "encrypted-pw-argon2-huge.tpk",
            "wrong_key",
            "an envelope asking Argon2id for 4 TiB (refused before any memory is taken)",
            Build::File(with_envelope(&pw, |e| e.replace("\"m_kib\":65536", "\"m_kib\":4294967295"))),
        ),
        case(
            "encrypted-pw-argon2-slow.tpk",
            "wrong_key",
            "an envelope asking Argon2id for a million passes",
            Build::File(with_envelope(&pw, |e| e.replace("\"t\":3", "\"t\":1000000"))),
        ),
        case(
            "encrypted-header-flipped.tpk",
            "tampered",
            "the header's segment size changed",
            Build::File({
                let mut b = tpk.clone();
                b[13] = 12;
                b
            }),
        ),
        case(
            "encrypted-segment-flipped.tpk",
            "tampered",
            "one byte of the second segment flipped",
            Build::File({
                let mut b = tpk.clone();
                b[16 + seg + 100] ^= 1;
                b
            }),
        ),
        case(
            "encrypted-cut.tpk",
            "tampered",
            "cut after its first segment, the envelope and trailer put back",
            Build::File([&tpk[..16 + seg], &tail[..]].concat()),
        ),
        case(
            "encrypted-size-in-tag.tpk",
            "tampered",
            "8 bytes of the last segment's tag removed",
            Build::File({
                let body_end = n - 16 - env_len;
                [&tpk[..body_end - 8], &tail[..]].concat()
            }),
        ),
        case("encrypted-empty.tpk", "not_encrypted", "a 0-byte file opened with a key", Build::File(vec![])),
        case(
            "encrypted-plain-dir",
            "not_encrypted",
            "a plain tree where an encrypted one is expected",
            Build::Custom(Box::new(|p: &Path| {
                std::fs::create_dir_all(p.join("packs")).unwrap();
                std::fs::write(p.join("treepack.json"), good_manifest()).unwrap();
                std::fs::write(p.join("packs/p.tpp"), DATA).unwrap();
            })),
        ),
        case(
            "encrypted-pack-flipped",
            "tampered",
            "one byte of a pack flipped",
            encrypted_dir_case(|rel, b| {
                if rel.starts_with("packs/") {
                    b[16 + 3] ^= 0x40;
                }
            }),
        ),
        case(
            "encrypted-pack-trailer",
            "tampered",
            "a pack whose trailer declares an envelope",
            encrypted_dir_case(|rel, b| {
                if rel.starts_with("packs/") {
                    let n = b.len();
                    b[n - 16] = 5;
                }
            }),
        ),
        case(
            "encrypted-pack-header",
            "tampered",
            "a pack whose header says another cipher",
            encrypted_dir_case(|rel, b| {
                if rel.starts_with("packs/") {
                    b[12] = 2;
                }
            }),
        ),
        case(
            "encrypted-manifest-flipped",
            "tampered",
            "one byte of the manifest's file flipped",
            encrypted_dir_case(|rel, b| {
                if rel == "treepack.json" {
                    b[20] ^= 1;
                }
            }),
        ),
    ]
}

fn cases() -> Vec<Case> {
    let tpk = good_tpk();
    let n = tpk.len();
    let flip = |i: usize, x: u8| {
        let mut b = tpk.clone();
        b[i] ^= x;
        b
    };
    let with_footer = |off: u64, len: u64| {
        let mut b = tpk.clone();
        b[n - 64..].copy_from_slice(&container::footer(off, len));
        b
    };
    let m = good_manifest();
    vec![
        // --- nothing, or not a manifest at all
        case("empty-dir", "not_found", "a folder with no manifest", Build::Custom(Box::new(|p| std::fs::create_dir_all(p).unwrap()))),
        case("manifest-empty", "not_treepack", "a 0-byte treepack.json", Build::Dir { manifest: vec![], pack: None }),
        case("manifest-zip", "not_treepack", "a zip file named treepack.json", Build::Dir { manifest: b"PK\x03\x04 not json".to_vec(), pack: None }),
        case("manifest-truncated", "not_treepack", "the last 10 bytes cut off", Build::Dir { manifest: m[..m.len() - 10].to_vec(), pack: Some(DATA.to_vec()) }),
        case("manifest-half", "not_treepack", "cut in half", Build::Dir { manifest: m[..m.len() / 2].to_vec(), pack: Some(DATA.to_vec()) }),
        case("manifest-edited", "manifest_checksum", "a value edited after sealing", Build::Dir { manifest: String::from_utf8(m.clone()).unwrap().replace("hostile", "hostilE").into_bytes(), pack: Some(DATA.to_vec()) }),
        case("manifest-no-hash", "not_treepack", "valid JSON without the manifest_hash trailer", Build::Dir { manifest: [body(PACKS, &good_root()), b"}\n".to_vec()].concat(), pack: Some(DATA.to_vec()) }),
        // --- versions and format name
        case("version-future", "unsupported_version", "major version 7", Build::Dir { manifest: seal(&String::from_utf8(body(PACKS, &good_root())).unwrap().replace("[1,0]", "[7,0]").into_bytes()), pack: Some(DATA.to_vec()) }),
        case("version-nan", "invalid_manifest", "NaN as the version", Build::Dir { manifest: seal(&String::from_utf8(body(PACKS, &good_root())).unwrap().replace("[1,0]", "[NaN,0]").into_bytes()), pack: Some(DATA.to_vec()) }),
        case("version-float", "invalid_manifest", "1.5 as the major version", Build::Dir { manifest: seal(&String::from_utf8(body(PACKS, &good_root())).unwrap().replace("[1,0]", "[1.5,0]").into_bytes()), pack: Some(DATA.to_vec()) }),
        case("format-name", "not_treepack", "format is not \"treepack\"", Build::Dir { manifest: seal(&String::from_utf8(body(PACKS, &good_root())).unwrap().replace("\"treepack\"", "\"safetensors\"").into_bytes()), pack: Some(DATA.to_vec()) }),
        // --- JSON-level hostility
        case("bad-utf8", "invalid_manifest", "invalid UTF-8 inside a string", Build::Dir { manifest: seal(b"{\"format\":\"treepack\",\"version\":[1,0],\n\"packs\":[],\n\"root\":\"\xff\xfe\""), pack: None }),
        case("deep-nesting", "invalid_manifest", "200 000 nested lists", sealed("[]", "[".repeat(200_000) + &"]".repeat(200_000), None)),
        case("deep-dicts", "invalid_manifest", "5 000 nested dict nodes", sealed("[]", "{\"t\":\"dict\",\"items\":[[\"a\",".repeat(5000) + "1" + &"]]}".repeat(5000), None)),
        case("dup-keys", "invalid_manifest", "a dict with key `a` twice", sealed("[]", "{\"t\":\"dict\",\"items\":[[\"a\",1],[\"a\",2]]}".into(), None)),
        case("deep-object-dicts", "invalid_manifest", "5 000 nested dicts written as objects (format 1.4)", sealed("[]", "{\"a\":".repeat(5000) + "1" + &"}".repeat(5000), None)),
        case("dup-object-keys", "invalid_manifest", "a dict written as an object with key `a` twice", sealed("[]", "{\"a\":1,\"b\":[],\"a\":2}".into(), None)),
        case("dup-escaped-object-keys", "invalid_manifest", "an object dict with `a` and `\\u0061`", sealed("[]", "{\"a\":1,\"\\u0061\":2}".into(), None)),
        case("object-dict-bad-value", "invalid_manifest", "an object dict holding a node type `pickle`", sealed("[]", "{\"x\":{\"t\":\"pickle\",\"v\":\"cos\\nsystem\"}}".into(), None)),
        case("dup-int-keys", "invalid_manifest", "a dict with int key 1 twice", sealed("[]", "{\"t\":\"dict\",\"items\":[[1,1],[1,2]]}".into(), None)),
        case("dup-fields", "invalid_manifest", "a record with field `a` twice", sealed("[]", "{\"t\":\"record\",\"type\":\"x\",\"fields\":[[\"a\",1],[\"a\",2]]}".into(), None)),
        case("dup-member", "invalid_manifest", "a JSON object with `items` twice", sealed("[]", "{\"t\":\"tuple\",\"items\":[],\"items\":[1]}".into(), None)),
        case("unknown-node", "invalid_manifest", "a node type `pickle` carrying a payload", sealed("[]", "{\"t\":\"pickle\",\"v\":\"cos\\nsystem\"}".into(), None)),
        case("list-key", "invalid_manifest", "an unhashable (list) dict key", sealed("[]", "{\"t\":\"dict\",\"items\":[[[1],2]]}".into(), None)),
        case("bad-int", "invalid_manifest", "a big int `12x`", sealed("[]", "{\"t\":\"int\",\"v\":\"12x\"}".into(), None)),
        case("bad-base64", "invalid_manifest", "inline bytes that are not base64", sealed("[]", "{\"t\":\"bytes\",\"b64\":\"!!\"}".into(), None)),
        case("trailing-garbage", "invalid_manifest", "garbage after the root", sealed("[]", "1} {".into(), None)),
        case("object-dtype", "invalid_manifest", "dtype `object`", sealed("[]", "{\"t\":\"array\",\"dtype\":\"object\",\"shape\":[],\"data\":\"\"}".into(), None)),
        case("inline-length", "invalid_manifest", "inline array data of the wrong length", sealed("[]", "{\"t\":\"array\",\"dtype\":\"int32\",\"shape\":[4],\"data\":\"AAAA\"}".into(), None)),
        // --- shapes, chunk grids and offsets
        case("shape-nan", "invalid_manifest", "NaN in a shape", sealed(PACKS, array_root("[NaN]", "[4]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("shape-float", "invalid_manifest", "4.5 in a shape", sealed(PACKS, array_root("[4.5]", "[4]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("shape-negative", "invalid_manifest", "-4 in a shape", sealed(PACKS, array_root("[-4]", "[4]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("shape-giant", "invalid_manifest", "2^32 × 2^32 elements (overflows u64 bytes)", sealed(PACKS, array_root("[4294967296,4294967296]", "[1,1]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("grid-giant", "invalid_manifest", "a grid of 2^40 chunks with one listed", sealed(PACKS, array_root("[1099511627776]", "[1]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("chunk-giant", "out_of_bounds", "one chunk claiming 1 TiB", sealed(PACKS, array_root("[274877906944]", "[274877906944]", "{\"pack\":0,\"offset\":0,\"length\":1099511627776,\"codec\":\"raw\",\"blake3\":\"af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262\"}"), Some(&DATA))),
        case("ndim-65", "invalid_manifest", "65 dimensions", sealed(PACKS, array_root(&format!("[4{}]", ",1".repeat(64)), &format!("[4{}]", ",1".repeat(64)), &chunk(0, 0, &DATA)), Some(&DATA))),
        case("chunk-dim-zero", "invalid_manifest", "a zero chunk dimension", sealed(PACKS, array_root("[4]", "[0]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("chunk-count", "invalid_manifest", "fewer chunks listed than the grid has", sealed(PACKS, array_root("[4]", "[2]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("chunk-length", "invalid_manifest", "chunk length disagrees with shape × itemsize", sealed(PACKS, array_root("[5]", "[5]", &chunk(0, 0, &DATA)), Some(&DATA))),
        case("offset-past-end", "out_of_bounds", "a chunk beyond its pack's declared size", sealed(PACKS, array_root("[4]", "[4]", &chunk(0, 8, &DATA)), Some(&DATA))),
        case("offset-overflow", "out_of_bounds", "offset + length overflows u64", sealed(PACKS, array_root("[4]", "[4]", &chunk(0, u64::MAX - 2, &DATA)), Some(&DATA))),
        case("overlapping-chunks", "chunk_corrupt", "chunk 1 overlaps chunk 0 (bytes 8..24 of 32) with a hash of other data", sealed("[{\"path\":\"packs/p.tpp\",\"size\":32}]", array_root("[8]", "[4]", &format!("{},{}", chunk(0, 0, &DATA), chunk(0, 8, &[9u8; 16]))), Some(&[DATA, DATA].concat()))),
        case("pack-index", "out_of_bounds", "a chunk in pack 3 of 1", sealed(PACKS, array_root("[4]", "[4]", &chunk(3, 0, &DATA)), Some(&DATA))),
        case("pack-truncated", "out_of_bounds", "the pack is shorter than declared", sealed(PACKS, good_root(), Some(&DATA[..8]))),
        case("pack-missing", "not_found", "the pack file does not exist", sealed(PACKS, good_root(), None)),
        case("pack-size-huge", "out_of_bounds", "a pack declared as 2^62 bytes, a chunk at 2^40 in a 16-byte file", sealed("[{\"path\":\"packs/p.tpp\",\"size\":4611686018427387904}]", array_root("[4]", "[4]", &chunk(0, 1 << 40, &DATA)), Some(&DATA))),
        case("unknown-codec", "invalid_manifest", "codec `zstd9`", sealed(PACKS, array_root("[4]", "[4]", &chunk(0, 0, &DATA).replace("raw", "zstd9")), Some(&DATA))),
        case("bad-hash-hex", "invalid_manifest", "a BLAKE3 that is not hex", sealed(PACKS, array_root("[4]", "[4]", &chunk(0, 0, &DATA).replace("\"blake3\":\"", "\"blake3\":\"zz")), Some(&DATA))),
        case("corrupt-data", "chunk_corrupt", "pack bytes that do not match their hash", sealed(PACKS, array_root("[4]", "[4]", &chunk(0, 0, &[9; 16])), Some(&DATA))),
        case("blob-bad-utf8", "invalid_manifest", "a string blob that is not UTF-8", sealed(PACKS, format!("{{\"t\":\"str\",\"size\":2,\"blob\":{}}}", chunk(0, 0, &[0xff, 0xfe])), Some(&[0xff, 0xfe]))),
        case("blob-size", "invalid_manifest", "a blob whose size disagrees with its chunk", sealed(PACKS, format!("{{\"t\":\"bytes\",\"size\":5,\"blob\":{}}}", chunk(0, 0, &DATA)), Some(&DATA))),
        // --- codecs (format 1.1): bombs, damaged frames, frames of the wrong length
        case("zstd-bomb", "bad_chunk", "a 16-byte region whose zstd frame inflates to 64 MiB", coded_case("zstd", &zstd_frame(&vec![0u8; 64 << 20]), &DATA)),
        case("zstd-declared-giant", "invalid_manifest", "a 1 TiB region claimed by a 16-byte zstd chunk", {
            let f = zstd_frame(&DATA);
            let packs = format!("[{{\"path\":\"packs/p.tpp\",\"size\":{}}}]", f.len());
            sealed(&packs, array_root("[274877906944]", "[274877906944]", &coded("zstd", &f, &DATA)), Some(&f))
        }),
        case("zstd-short", "bad_chunk", "a zstd frame of 8 bytes for a 16-byte region", coded_case("zstd", &zstd_frame(&DATA[..8]), &DATA)),
        case("zstd-garbled", "bad_chunk", "16 random bytes labelled zstd", coded_case("zstd", &[0x28, 0xb5, 0x2f, 0xfd, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2], &DATA)),
        case("zstd-truncated", "bad_chunk", "a zstd frame with its last bytes cut", {
            let f = zstd_frame(&[DATA; 64].concat());
            let f = f[..f.len() - 4].to_vec();
            coded_case("zstd", &f, &DATA)
        }),
        case("zstd-other-content", "chunk_corrupt", "a valid zstd frame of other bytes than the hash records", coded_case("zstd", &zstd_frame(&[9u8; 16]), &DATA)),
        case("lz4-garbled", "bad_chunk", "bytes labelled lz4 that are no LZ4 block", coded_case("lz4", &[0xff; 24], &DATA)),
        case("lz4-long", "bad_chunk", "an LZ4 block of 4 KiB for a 16-byte region", coded_case("lz4", &lz4_flex::block::compress(&[1u8; 4096]), &DATA)),
        case("shuffle-blob", "invalid_manifest", "a bytes blob with the array-only codec shuffle+zstd", {
            let f = zstd_frame(&DATA);
            let packs = format!("[{{\"path\":\"packs/p.tpp\",\"size\":{}}}]", f.len());
            sealed(&packs, format!("{{\"t\":\"bytes\",\"size\":16,\"blob\":{}}}", coded("shuffle+zstd", &f, &DATA)), Some(&f))
        }),
        // --- compressed manifests (format 1.6): a zstd frame holding the manifest's JSON
        case("packed-manifest-truncated", "invalid_manifest", "a compressed manifest with its last bytes cut", Build::Dir { manifest: { let f = zstd_frame(&m); f[..f.len() - 6].to_vec() }, pack: Some(DATA.to_vec()) }),
        case("packed-manifest-trailing", "invalid_manifest", "bytes after a compressed manifest's frame", Build::Dir { manifest: [zstd_frame(&m), b"{}".to_vec()].concat(), pack: Some(DATA.to_vec()) }),
        case("packed-manifest-not-json", "invalid_manifest", "a frame holding a zip file", Build::Dir { manifest: zstd_frame(b"PK\x03\x04 not json"), pack: Some(DATA.to_vec()) }),
        case("packed-manifest-edited", "manifest_checksum", "a frame holding a manifest edited after sealing", Build::Dir { manifest: zstd_frame(String::from_utf8(m.clone()).unwrap().replace("hostile", "hostilE").as_bytes()), pack: Some(DATA.to_vec()) }),
        case("packed-manifest-garbled", "invalid_manifest", "the zstd magic followed by random bytes", Build::Dir { manifest: vec![0x28, 0xb5, 0x2f, 0xfd, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2], pack: Some(DATA.to_vec()) }),
        case("packed-manifest-bomb", "invalid_manifest", "a small frame of 64 MiB of spaces before the JSON (refused at its first bytes)", Build::Dir { manifest: spaces_then(64 << 20, &m), pack: Some(DATA.to_vec()) }),
        case("packed-manifest-expands", "limit_exceeded", "a small frame of the manifest's first bytes, then 64 MiB of spaces (past 32 times its size)", Build::Dir { manifest: spaces_then_with_head(b"{\"format\":\"treepack\",\"version\":[1,6],", 64 << 20, b"}"), pack: Some(DATA.to_vec()) }),
        case("packed-manifest-nested", "invalid_manifest", "a frame holding a frame holding the manifest", Build::Dir { manifest: zstd_frame(&zstd_frame(&m)), pack: Some(DATA.to_vec()) }),
        // --- shared nodes and refs (format 1.2)
        case("ref-unknown", "invalid_manifest", "a ref to an id no shared node has", sealed("[]", "[1,{\"t\":\"ref\",\"id\":7}]".into(), None)),
        case("ref-forward", "invalid_manifest", "a ref before the shared node it names", sealed("[]", "[{\"t\":\"ref\",\"id\":0},{\"t\":\"shared\",\"id\":0,\"v\":[1]}]".into(), None)),
        case("shared-out-of-order", "invalid_manifest", "shared ids 1 then 0", sealed("[]", "[{\"t\":\"shared\",\"id\":1,\"v\":[1]},{\"t\":\"shared\",\"id\":0,\"v\":[2]}]".into(), None)),
        case("shared-twice", "invalid_manifest", "two shared nodes with id 0", sealed("[]", "[{\"t\":\"shared\",\"id\":0,\"v\":[1]},{\"t\":\"shared\",\"id\":0,\"v\":[2]}]".into(), None)),
        case("shared-self", "invalid_manifest", "a shared node whose value is a ref to itself (never reaches a value)", sealed("[]", "{\"t\":\"shared\",\"id\":0,\"v\":{\"t\":\"ref\",\"id\":0}}".into(), None)),
        case("shared-nested", "invalid_manifest", "a shared node whose value is a shared node", sealed("[]", "{\"t\":\"shared\",\"id\":0,\"v\":{\"t\":\"shared\",\"id\":1,\"v\":[]}}".into(), None)),
        case("shared-v-first", "invalid_manifest", "`v` before `id`", sealed("[]", "{\"t\":\"shared\",\"v\":[1],\"id\":0}".into(), None)),
        case("shared-no-v", "invalid_manifest", "a shared node without `v`", sealed("[]", "{\"t\":\"shared\",\"id\":0}".into(), None)),
        case("ref-no-id", "invalid_manifest", "a ref without `id`", sealed("[]", "[{\"t\":\"ref\"}]".into(), None)),
        case("ref-id-negative", "invalid_manifest", "a ref with id -1", sealed("[]", "{\"t\":\"shared\",\"id\":0,\"v\":[{\"t\":\"ref\",\"id\":-1}]}".into(), None)),
        case("ref-chain-deep", "invalid_manifest", "shared nodes nested 5000 deep through lists", sealed("[]", {
            let mut s = String::new();
            for i in 0..5000 {
                s.push_str(&format!("{{\"t\":\"shared\",\"id\":{i},\"v\":["));
            }
            s.push_str(&"]}".repeat(5000));
            s
        }, None)),
        // --- array annotations (format 1.3)
        case("array-as-string", "invalid_manifest", "an array whose `as` is a string", sealed("[]", "{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"as\":\"torch.Tensor\",\"data\":\"AQ==\"}".into(), None)),
        case("array-as-no-type", "invalid_manifest", "an array whose `as` has no `type`", sealed("[]", "{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"as\":{\"requires_grad\":true},\"data\":\"AQ==\"}".into(), None)),
        case("array-as-huge-type", "invalid_manifest", "an array whose `as` type is 100 kB", sealed("[]", format!("{{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"as\":{{\"type\":\"{}\"}},\"data\":\"AQ==\"}}", "x".repeat(100_000)), None)),
        case("array-as-twice", "invalid_manifest", "an array with two `as` members", sealed("[]", "{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"as\":{\"type\":\"a\"},\"as\":{\"type\":\"a\"},\"data\":\"AQ==\"}".into(), None)),
        // --- free JSON nested 100 000 deep (issue 50): refused while it is read, 128 levels in
        case("deep-metadata", "invalid_manifest", "`metadata` of 100 000 nested lists", Build::Dir { manifest: seal(&with_metadata(&body("[]", "1"), &deep_lists())), pack: None }),
        case("deep-custom-data", "invalid_manifest", "a custom node whose `data` is 100 000 nested lists", sealed("[]", format!("{{\"t\":\"custom\",\"type\":\"x.Y\",\"data\":{}}}", deep_lists()), None)),
        case("deep-array-as", "invalid_manifest", "an array whose `as` holds 100 000 nested lists", sealed("[]", format!("{{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"as\":{{\"type\":\"t\",\"x\":{}}},\"data\":\"AQ==\"}}", deep_lists()), None)),
        // --- pack paths and links
        case("pack-path-parent", "invalid_manifest", "pack path `../outside.tpp`", sealed("[{\"path\":\"../outside.tpp\",\"size\":16}]", good_root(), None)),
        case("pack-path-absolute", "invalid_manifest", "pack path `/etc/passwd`", sealed("[{\"path\":\"/etc/passwd\",\"size\":16}]", good_root(), None)),
        case("pack-path-sneaky", "invalid_manifest", "pack path `packs/../../x`", sealed("[{\"path\":\"packs/../../x\",\"size\":16}]", good_root(), None)),
        case("pack-path-backslash", "invalid_manifest", "pack path with a backslash", sealed("[{\"path\":\"packs/a\\\\b\",\"size\":16}]", good_root(), None)),
        case("symlink-pack", "link", "packs/p.tpp is a symlink to /etc/hostname", Build::Custom(Box::new(|p| {
            std::fs::create_dir_all(p.join("packs")).unwrap();
            std::fs::write(p.join("treepack.json"), good_manifest()).unwrap();
            std::os::unix::fs::symlink("/etc/hostname", p.join("packs/p.tpp")).unwrap();
        }))),
        case("symlink-manifest", "link", "treepack.json is a symlink", Build::Custom(Box::new(|p| {
            std::fs::create_dir_all(p.join("packs")).unwrap();
            std::fs::write(p.join("packs/p.tpp"), DATA).unwrap();
            std::fs::write(p.join("real.json"), good_manifest()).unwrap();
            std::os::unix::fs::symlink("real.json", p.join("treepack.json")).unwrap();
        }))),
        // --- single files
        case("tpk-empty.tpk", "not_treepack", "a 0-byte .tpk", Build::File(vec![])),
        case("tpk-header-only.tpk", "not_treepack", "only the 64-byte header", Build::File(tpk[..64].to_vec())),
        case("tpk-truncated.tpk", "not_treepack", "cut in the middle", Build::File(tpk[..n / 2].to_vec())),
        case("tpk-bad-magic.tpk", "not_treepack", "header magic changed", Build::File(flip(0, 0x20))),
        case("tpk-future-version.tpk", "unsupported_version", "header says format 9", Build::File({
            let mut b = tpk.clone();
            b[8] = 9;
            b
        })),
        case("tpk-footer-past-end.tpk", "not_treepack", "footer points past the end", Build::File(with_footer(n as u64, 100))),
        case("tpk-footer-huge-len.tpk", "not_treepack", "footer declares a 1 TiB manifest", Build::File(with_footer(64, 1 << 40))),
        case("tpk-footer-into-header.tpk", "not_treepack", "manifest range overlapping the header", Build::File(with_footer(0, 100))),
        case("tpk-footer-reserved.tpk", "not_treepack", "non-zero reserved footer bytes", Build::File(flip(n - 30, 1))),
        case("tpk-corrupt-chunk.tpk", "chunk_corrupt", "one data byte flipped", Build::File(flip(5000, 1))),
        case("tpk-not-a-tpk.tpk", "not_treepack", "an HDF5 signature", Build::File(b"\x89HDF\r\n\x1a\n and more bytes that are not treepack at all".repeat(3))),
        // JSON transport documents (docs/format.md section 11): a `.json` file is read as the
        // tree it holds.
        case("transport-truncated.json", "not_treepack", "a document cut in the middle of its manifest", Build::File({
            let d = transport_doc(|b| b.to_string(), &DATA);
            d[..d.len() / 2].to_vec()
        })),
        case("transport-future-version.json", "unsupported_version", "a document of major version 7", Build::File({
            let d = String::from_utf8(transport_doc(|b| b.to_string(), &DATA)).unwrap();
            d.replacen("\"version\":[1,0]", "\"version\":[7,0]", 1).into_bytes()
        })),
        case("transport-bad-data.json", "not_treepack", "data that is not base85", Build::File({
            let d = String::from_utf8(transport_doc(|b| b.to_string(), &DATA)).unwrap();
            d.replacen("\"data\":\"", "\"data\":\"\\u0000", 1).into_bytes()
        })),
        case("transport-short-data.json", "invalid_manifest", "data 4 bytes shorter than its chunks", Build::File(transport_doc(|b| b.to_string(), &DATA[..12]))),
        case("transport-other-pack.json", "invalid_manifest", "a manifest naming a pack the document does not hold", Build::File(transport_doc(|b| b.replace("packs/transport.tpp", "packs/p.tpp"), &DATA))),
        case("transport-edited.json", "manifest_checksum", "a manifest edited after sealing", Build::File({
            let d = String::from_utf8(transport_doc(|b| b.to_string(), &DATA)).unwrap();
            d.replacen("\"writer\":\"hostile\"", "\"writer\":\"hostilE\"", 1).into_bytes()
        })),
        case("transport-deep-metadata.json", "invalid_manifest", "a document whose manifest's `metadata` is 100 000 nested lists", Build::File(transport_doc(|b| String::from_utf8(with_metadata(b.as_bytes(), &deep_lists())).unwrap(), &DATA))),
        case("transport-giant-size.json", "invalid_manifest", "a chunk 1 TiB long in a 16-byte document", Build::File(transport_doc(|b| b.replace("\"length\":16", "\"length\":1099511627776").replace("\"size\":16", "\"size\":1099511627776"), &DATA))),
        // Repositories (docs/format.md section 10): the case is the tree `t` of the repository
        // `repo-…` (the part before `@`).
        case("repo-ref-traversal@t", "invalid_manifest", "a ref naming ../../etc/passwd", repo_case(|m| {
            format!(r#"{{"tree":"../../etc/passwd","root":"{}","saved_ms":1,"bytes_written":0,"bytes_reused":0}}"#, Hash32::of(m).to_hex()).into_bytes()
        }, true)),
        case("repo-ref-not-json@t", "invalid_manifest", "a ref that is not JSON", repo_case(|_| b"\x00\xffnot a ref".to_vec(), true)),
        case("repo-ref-huge@t", "limit_exceeded", "a 2 MiB ref", repo_case(|_| vec![b' '; 2 << 20], true)),
        case("repo-ref-bad-root@t", "invalid_manifest", "a ref whose root is not 64 hex digits", repo_case(|m| {
            format!(r#"{{"tree":"trees/{}.json","root":"zz","saved_ms":1,"bytes_written":0,"bytes_reused":0}}"#, Hash32::of(m).to_hex()).into_bytes()
        }, true)),
        case("repo-tree-swapped@t", "manifest_checksum", "a manifest whose bytes do not hash to its name", Build::Custom(Box::new(|p: &Path| {
            // The good repository, then another valid manifest put in place of the named one.
            (repo_case(good_ref, true).custom())(p);
            let other = seal(&body(PACKS, &array_root("[2]", "[2]", &chunk(0, 0, &DATA[..8]))));
            let named = repo_dir(p).join(format!("trees/{}.json", Hash32::of(&good_manifest()).to_hex()));
            std::fs::write(named, other).unwrap();
        }))),
        case("repo-tree-missing@t", "not_found", "a ref naming a manifest that is not there", repo_case(good_ref, false)),
        case("repo-no-such-name@t", "not_found", "a repository without the name", Build::Custom(Box::new(|p: &Path| {
            let dir = repo_dir(p);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("treepack-repo.json"), treepack::format::repo::marker_bytes()).unwrap();
        }))),
    ]
    .into_iter()
    // Encrypted trees (docs/format.md section 13), opened with their key (`case_key`).
    .chain(encrypted_cases())
    .collect()
}

fn write_case(root: &Path, c: &Case) {
    let p = root.join(c.name);
    match &c.build {
        Build::Dir { manifest, pack } => {
            std::fs::create_dir_all(p.join("packs")).unwrap();
            std::fs::write(p.join("treepack.json"), manifest).unwrap();
            if let Some(d) = pack {
                std::fs::write(p.join("packs/p.tpp"), d).unwrap();
            }
        }
        Build::Sealed { packs, root: r, pack } => {
            std::fs::create_dir_all(p.join("packs")).unwrap();
            std::fs::write(p.join("treepack.json"), seal(&body(packs, r))).unwrap();
            if let Some(d) = pack {
                std::fs::write(p.join("packs/p.tpp"), d).unwrap();
            }
        }
        Build::File(b) => std::fs::write(&p, b).unwrap(),
        Build::Custom(f) => f(&p),
    }
    // Git does not keep empty folders.
    if p.is_dir() && std::fs::read_dir(&p).unwrap().next().is_none() {
        std::fs::write(p.join(".keep"), b"").unwrap();
    }
}

fn expected() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(corpus_dir().join("EXPECTED.tsv"))
        .expect("tests/hostile/EXPECTED.tsv is missing: run TREEPACK_BLESS=1 cargo test -p treepack --test hostile");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            (f.next().unwrap().into(), f.next().unwrap().into(), f.next().unwrap_or("").into())
        })
        .collect()
}

#[test]
fn corpus_matches_its_generator() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let cs = cases();
    if std::env::var("TREEPACK_BLESS").is_ok() {
        let root = corpus_dir();
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let mut tsv =
            String::from("# case\texpected error kind\twhat it is (generated by crates/treepack/tests/hostile.rs)\n");
        for c in &cs {
            write_case(&root, c);
            tsv.push_str(&format!("{}\t{}\t{}\n", c.name, c.kind, c.what));
        }
        std::fs::write(root.join("EXPECTED.tsv"), tsv).unwrap();
    }
    let names: Vec<String> = cs.iter().map(|c| c.name.to_string()).collect();
    let listed: Vec<String> = expected().into_iter().map(|e| e.0).collect();
    assert_eq!(names, listed, "tests/hostile is stale: re-bless");
    // Fresh generation gives the same bytes as the committed corpus (single files compared).
    let d = tempfile::tempdir().unwrap();
    for c in cs.iter().filter(|c| matches!(c.build, Build::File(_))) {
        write_case(d.path(), c);
        assert_eq!(
            std::fs::read(d.path().join(c.name)).unwrap(),
            std::fs::read(corpus_dir().join(c.name)).unwrap(),
            "{}",
            c.name
        );
    }
}

/// Held by each test of this file while it runs: the RSS bound measures one test alone.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn every_hostile_case_fails_fast_with_its_error_kind() {
    // Peak RSS is the process's: the generator test (tens of MiB of cases) must not run beside it.
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let rows = expected();
    assert!(rows.len() >= 40, "the corpus holds {} cases; the bar is 40", rows.len());
    // Reset the peak to what the process holds now (Linux: "5" to clear_refs), so that what
    // the generator test held before does not hide growth here.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let base = peak_rss_kib();
    let mut report = vec![];
    for (name, kind, what) in &rows {
        let path = corpus_dir().join(name);
        let p = path.to_str().unwrap();
        let t = Instant::now();
        let e = case_location(name, p).and_then(|l| load(l, &LoadOptions::default())).expect_err(name);
        let took = t.elapsed();
        assert_eq!(e.kind(), kind, "{name} ({what}): {e}");
        assert!(took < Duration::from_secs(1), "{name} took {took:?}");
        // The message names the location (a repository's, for a tree of one), so users can
        // find the bad file.
        let shown = name.split('@').next().unwrap();
        assert!(e.to_string().contains(shown), "{name}: {e}");
        // The other entry points refuse it too (or, where only data is bad, read just the manifest).
        let t = Instant::now();
        match case_location(name, p).and_then(open) {
            Ok(r) => {
                let _ = r.structure();
                let _ = r.verify();
            }
            Err(e2) => {
                assert_eq!(e2.kind(), *kind, "{name} via open: {e2}");
                // The one-pass parse (what the Python bindings build from) refuses every manifest
                // that `open` refuses for its content.
                // (A transport document that cannot be read is refused as its location is parsed.)
                let Ok(loc) = case_location(name, p) else { continue };
                if let Ok((bytes, file)) = block_on(treepack::read::manifest_bytes(&loc)) {
                    let one_pass = manifest::build(&bytes, &file, &manifest::OwnedTree);
                    let layout_ok =
                        |pk: &manifest::Parsed<_>| pk.packs.iter().all(|x| loc.layout().allows_pack(&x.path));
                    assert!(!one_pass.as_ref().is_ok_and(layout_ok), "{name}: one-pass parse accepted it");
                }
            }
        }
        assert!(t.elapsed() < Duration::from_secs(1), "{name}: open+verify took {:?}", t.elapsed());
        report.push(format!("{name}: {kind} in {took:?}"));
    }
    let grew_mib = peak_rss_kib().saturating_sub(base) / 1024;
    assert!(grew_mib < 100, "peak RSS grew by {grew_mib} MiB over the corpus");
    eprintln!("{} hostile cases, peak RSS growth {grew_mib} MiB\n{}", rows.len(), report.join("\n"));
}
