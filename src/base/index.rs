//! Key layout of the host base index (one encrypted RocksDB per host, opened like a tenant
//! store under a key derived from the master key).
//!
//! ```text
//! extents  "B" ‖ hash                      -> block record: pack ‖ slot ‖ nonce ‖ tag ‖ refs
//!                                             (‖ offset ‖ length: a fragment)
//! extents  "R" ‖ base ‖ 0 ‖ hash           -> ""  (the distinct blocks of a base)
//! inodes   "T" ‖ base ‖ 0 ‖ seq            -> tree entry (JSON): path, kind, mode, size, ...
//! dirents  "K" ‖ base ‖ 0 ‖ seq ‖ index    -> hash of a file's block (absent: hole)
//! meta     "N" ‖ base                      -> base record (JSON)
//! meta     "P" ‖ block size                -> pack id ‖ next free slot (where appends go)
//! ```
//! `refs` counts the bases whose tree holds the block; base names sort before their 0 byte
//! (names never contain one), so one base's keys form one range.

use super::BlockHash;

/// A block record of a block that has its slot to itself.
pub const LOC_LEN: usize = 4 + 4 + 12 + 16 + 4;
/// A block record of a fragment: [`LOC_LEN`] ‖ offset ‖ length.
pub const FRAGMENT_LOC_LEN: usize = LOC_LEN + 4 + 2;

/// Where in its slot a block stored as a fragment is: a short block (its bytes up to the last
/// non-zero one, at most [`crate::base::pack::FRAGMENT_MAX`]) shares a slot with others, within
/// one 4 KiB page of it (see `pack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// Bytes from the start of the slot.
    pub offset: u32,
    /// Bytes stored: the block's bytes up to its last non-zero one; the rest is zeros.
    pub len: u16,
}

impl Fragment {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }

    fn decode(v: &[u8]) -> Option<Self> {
        Some(Self {
            offset: u32::from_be_bytes(v.get(..4)?.try_into().ok()?),
            len: u16::from_be_bytes(v.get(4..6)?.try_into().ok()?),
        })
    }
}

/// Where a stored block is and how to open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    pub pack: u32,
    pub slot: u32,
    /// `None`: the block fills its slot.
    pub fragment: Option<Fragment>,
    pub nonce: [u8; 12],
    pub tag: [u8; 16],
    pub refs: u32,
}

impl BlockRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FRAGMENT_LOC_LEN);
        out.extend_from_slice(&self.pack.to_be_bytes());
        out.extend_from_slice(&self.slot.to_be_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.tag);
        out.extend_from_slice(&self.refs.to_be_bytes());
        if let Some(p) = &self.fragment {
            p.encode(&mut out);
        }
        out
    }

    pub fn decode(v: &[u8]) -> Option<Self> {
        let fragment = match v.len() {
            LOC_LEN => None,
            FRAGMENT_LOC_LEN => Some(Fragment::decode(&v[LOC_LEN..])?),
            _ => return None,
        };
        Some(Self {
            pack: u32::from_be_bytes(v[..4].try_into().ok()?),
            slot: u32::from_be_bytes(v[4..8].try_into().ok()?),
            fragment,
            nonce: v[8..20].try_into().ok()?,
            tag: v[20..36].try_into().ok()?,
            refs: u32::from_be_bytes(v[36..40].try_into().ok()?),
        })
    }

    /// Bytes the block takes in its pack: its slot, or its fragment.
    pub fn stored_bytes(&self, block_size: u32) -> u64 {
        self.fragment.map_or(block_size, |p| u32::from(p.len)) as u64
    }

    /// The fragment's fields as a reference carries them (after the common ones).
    pub(crate) fn encode_fragment(&self, out: &mut Vec<u8>) {
        if let Some(p) = &self.fragment {
            p.encode(out);
        }
    }

    pub(crate) fn decode_fragment(v: &[u8]) -> Option<Fragment> {
        Fragment::decode(v)
    }
}

fn prefixed(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut k = vec![tag];
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

pub fn block_key(hash: &BlockHash) -> Vec<u8> {
    prefixed(b'B', &[hash])
}

pub const BLOCKS_START: &[u8] = b"B";
pub const BLOCKS_END: &[u8] = b"C";

/// Start and end of one base's keys with `tag`.
pub fn base_range(tag: u8, base: &str) -> (Vec<u8>, Vec<u8>) {
    (
        prefixed(tag, &[base.as_bytes(), &[0]]),
        prefixed(tag, &[base.as_bytes(), &[1]]),
    )
}

pub fn ref_key(base: &str, hash: &BlockHash) -> Vec<u8> {
    prefixed(b'R', &[base.as_bytes(), &[0], hash])
}

pub fn tree_key(base: &str, seq: u64) -> Vec<u8> {
    prefixed(b'T', &[base.as_bytes(), &[0], &seq.to_be_bytes()])
}

pub fn file_block_key(base: &str, seq: u64, index: u64) -> Vec<u8> {
    prefixed(
        b'K',
        &[
            base.as_bytes(),
            &[0],
            &seq.to_be_bytes(),
            &index.to_be_bytes(),
        ],
    )
}

pub fn base_key(base: &str) -> Vec<u8> {
    prefixed(b'N', &[base.as_bytes()])
}

pub const BASES_START: &[u8] = b"N";
pub const BASES_END: &[u8] = b"O";

pub fn alloc_key(block_size: u32) -> Vec<u8> {
    prefixed(b'P', &[&block_size.to_be_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_ranges_hold_their_keys() {
        let mut r = BlockRecord {
            pack: 3,
            slot: 99,
            fragment: None,
            nonce: [7; 12],
            tag: [9; 16],
            refs: 2,
        };
        assert_eq!(r.encode().len(), LOC_LEN);
        assert_eq!(BlockRecord::decode(&r.encode()), Some(r));
        assert_eq!(r.stored_bytes(4096), 4096);
        r.fragment = Some(Fragment {
            offset: 70_000,
            len: 7,
        });
        assert_eq!(r.encode().len(), FRAGMENT_LOC_LEN);
        assert_eq!(BlockRecord::decode(&r.encode()), Some(r));
        assert_eq!(r.stored_bytes(4096), 7);
        assert_eq!(BlockRecord::decode(&[0; 5]), None);
        assert_eq!(BlockRecord::decode(&r.encode()[..LOC_LEN + 3]), None);
        let (start, end) = base_range(b'R', "ubuntu");
        let k = ref_key("ubuntu", &[0xff; 32]);
        assert!(start <= k && k < end);
        assert!(!(start.clone()..end.clone()).contains(&ref_key("ubuntu2", &[0; 32])));
        assert!(!(start..end).contains(&ref_key("ubunt", &[0xff; 32])));
        let (start, end) = base_range(b'K', "a");
        assert!((start..end).contains(&file_block_key("a", u64::MAX, u64::MAX)));
    }
}
