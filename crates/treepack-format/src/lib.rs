//! # treepack-format
//!
//! The treepack format, with no I/O: what a second implementation must match (docs/format.md).
//! The `treepack` engine re-exports this crate as `treepack::format` (and [`error`] as
//! `treepack::error`); it reads and writes the bytes, this crate says what they mean. Nothing
//! here opens a file, a socket or a runtime, or starts a thread: the engine passes its pools in
//! through [`exec`], and fuzz targets link this crate alone.
//!
//! [`model`] is the in-memory tree; [`dtype`], [`keypath`], [`grid`] (chunking and slicing),
//! [`hash`] (BLAKE3 of canonical bytes), [`codec`] and [`preview`] describe its leaves;
//! [`merkle`] is the root hash over a whole tree, [`diff`] what differs between two;
//! [`safetensors`] reads and writes that format's header, [`gguf`] parses llama.cpp's model files'
//! headers; [`transport`] frames a tree as one
//! JSON document and [`schema`] describes a tree's type as a JSON Schema; [`json`] reads the free
//! JSON values files hold (metadata, annotations, ...) with their depth bounded;
//! [`manifest`] writes and parses `treepack.json`; [`container`] is the single-file (`.tpk`)
//! layout around it; [`signature`] signs a tree's root hash (DSSE envelopes of in-toto
//! statements); [`error`] holds the typed errors of the format and of the engine alike.
//! Reading and writing bytes somewhere is the engine's job (`store`, `save`, `read`); the
//! threads that big hashes and parses may use are the caller's, passed in through [`exec`].

#![warn(missing_docs)]

pub mod codec;
pub mod container;
pub mod crypt;
pub mod diff;
pub mod dtype;
pub mod element;
pub mod error;
pub mod exec;
pub mod gguf;
pub mod grid;
pub mod hash;
pub mod json;
pub mod keypath;
pub mod manifest;
pub mod merkle;
pub mod model;
pub mod parts;
pub mod pickle;
pub mod preview;
pub mod refs;
pub mod repo;
pub mod safetensors;
pub mod schema;
pub mod signature;
pub mod transport;

pub use error::{Error, Result};
