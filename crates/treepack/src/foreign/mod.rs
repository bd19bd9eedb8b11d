//! Checkpoints of other tools, read as trees without running their code (issue 54).
//!
//! [`torch`] reads `torch.save` files (`.pt`, `.pth`, `pytorch_model.bin`) through the pickle
//! reader of [`format::pickle`](crate::format::pickle), which interprets pickles as data and
//! never imports or calls anything. Nothing here is wired into [`load`](crate::load) or
//! `convert` yet: the function that recognises foreign files by content calls
//! [`torch::sniff`] and then [`torch::read`] or [`torch::read_structure`].

pub mod torch;
