//! The format, with no I/O: what a second implementation must match (docs/format.md).
//!
//! [`model`] is the in-memory tree; [`dtype`], [`keypath`], [`grid`] (chunking and slicing),
//! [`hash`] (BLAKE3 of canonical bytes), [`codec`] and [`preview`] describe its leaves;
//! [`merkle`] is the root hash over a whole tree, [`diff`] what differs between two;
//! [`safetensors`] reads and writes that format's header; [`transport`] frames a tree as one
//! JSON document and [`schema`] describes a tree's type as a JSON Schema; [`json`] reads the free
//! JSON values files hold (metadata, annotations, ...) with their depth bounded;
//! [`manifest`] writes and parses `treepack.json`; [`container`] is the single-file (`.tpk`)
//! layout around it. Reading and writing bytes somewhere is the engine's job (`store`, `save`,
//! `read`).

pub mod codec;
pub mod container;
pub mod diff;
pub mod dtype;
pub mod grid;
pub mod hash;
pub mod json;
pub mod keypath;
pub mod manifest;
pub mod merkle;
pub mod model;
pub mod parts;
pub mod preview;
pub mod refs;
pub mod repo;
pub mod safetensors;
pub mod schema;
pub mod transport;
