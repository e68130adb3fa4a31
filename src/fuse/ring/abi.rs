//! The ring entry's layout (include/uapi/linux/fuse.h, `fuse_uring_req_header` and
//! `fuse_uring_cmd_req`): where in an entry's header the kernel puts the request and the
//! entry's bookkeeping. The request structs themselves are in [`crate::fuse::wire`].

/// `struct fuse_uring_req_header`: the request's `fuse_in_header` (reply: `fuse_out_header`)
/// at 0, the op's fixed in-struct at 128, `fuse_uring_ent_in_out` at 256.
pub const HEADER_SIZE: usize = 288;
pub const OP_IN: usize = 128;
pub const ENT_COMMIT_ID: usize = 256 + 8;
pub const ENT_PAYLOAD_SZ: usize = 256 + 16;

/// `enum fuse_uring_cmd` (the SQE's cmd_op).
pub const CMD_REGISTER: u32 = 1;
pub const CMD_COMMIT_AND_FETCH: u32 = 2;
