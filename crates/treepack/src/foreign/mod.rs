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
