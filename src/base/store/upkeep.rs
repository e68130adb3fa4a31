//! Keeping the base store in shape: `gc` gives back the space of blocks no base holds any
//! more (slot runs punched into holes, packs with nothing live deleted) and `verify` reads
//! back every stored block and checks it against its hash.

use std::collections::{HashMap, HashSet};

use super::{BaseStore, GcReport, Progress, VerifyReport};
use crate::base::index::BlockRecord;
use crate::base::{BaseError, BlockHash};
use crate::store::Family;

impl BaseStore {
    /// Gives back the disk space of pack slots that no block record points at: runs of such
    /// slots become holes (the file keeps its size, so no live block moves and tenants'
    /// references stay valid), and a pack with no live block left is deleted (never the one
    /// imports append to). It changes no index entry, so a crash at any point is harmless and
    /// running it again finishes the job.
    pub fn gc(&self, progress: &mut dyn FnMut(Progress)) -> Result<GcReport, BaseError> {
        // A slot is live while any block in it is (a block of its own, or one of its fragments).
        let mut live: HashMap<u32, HashSet<u32>> = HashMap::new();
        let mut live_blocks = 0u64;
        self.for_each_block(|_, r| {
            live.entry(r.pack).or_default().insert(r.slot);
            live_blocks += 1;
        })?;
        // Where imports append: those packs stay, and slots from the append point on are not
        // garbage but free.
        let mut appending: HashMap<u32, u32> = HashMap::new();
        self.index.range(Family::Meta, b"P", b"Q", |_, v| {
            if v.len() == 8 {
                appending.insert(
                    u32::from_be_bytes(v[..4].try_into().expect("4 bytes")),
                    u32::from_be_bytes(v[4..].try_into().expect("4 bytes")),
                );
            }
            true
        })?;
        let ids = self.pack_ids()?;
        let mut report = GcReport {
            live_blocks,
            ..GcReport::default()
        };
        for (n, id) in ids.iter().enumerate() {
            progress(Progress {
                done_bytes: n as u64,
                total_bytes: ids.len() as u64,
            });
            report.packs += 1;
            let pack = self.pack(*id)?;
            let path = pack.path().to_owned();
            let io = BaseError::io(&path);
            let before = pack.allocated_bytes().map_err(&io)?;
            let slots_live = live.get(id);
            if slots_live.is_none() && !appending.contains_key(id) {
                drop(pack);
                self.packs.forget(*id);
                std::fs::remove_file(&path).map_err(BaseError::io(&path))?;
                report.packs_deleted += 1;
                report.reclaimed_bytes += before;
                continue;
            }
            let end = match appending.get(id) {
                Some(&next) => next as u64,
                None => pack.slots_on_disk().map_err(&io)?,
            };
            let mut run: Option<(u32, u32)> = None;
            for slot in 0..end as u32 {
                let garbage = !slots_live.is_some_and(|s| s.contains(&slot));
                if garbage {
                    report.garbage_slots += 1;
                    run = Some(match run {
                        Some((first, n)) => (first, n + 1),
                        None => (slot, 1),
                    });
                } else if let Some((first, n)) = run.take() {
                    pack.punch(first, n).map_err(&io)?;
                }
            }
            if let Some((first, n)) = run {
                pack.punch(first, n).map_err(&io)?;
            }
            report.reclaimed_bytes += before.saturating_sub(pack.allocated_bytes().map_err(&io)?);
        }
        progress(Progress {
            done_bytes: ids.len() as u64,
            total_bytes: ids.len() as u64,
        });
        tracing::info!(?report, "base gc done");
        Ok(report)
    }

    /// Reads every stored block back and checks it; and that every block a tree names exists.
    pub fn verify(&self) -> Result<VerifyReport, BaseError> {
        let mut report = VerifyReport::default();
        let mut blocks: Vec<(BlockHash, BlockRecord)> = Vec::new();
        self.for_each_block(|h, r| blocks.push((*h, r)))?;
        for (h, rec) in &blocks {
            report.blocks += 1;
            // The record is in hand: read the slot without looking it up again.
            let read = self.pack(rec.pack).and_then(|p| {
                let mut out = vec![0u8; p.block_size as usize];
                self.packs.read_into(h, rec, &mut out)
            });
            match read {
                Ok(()) => {}
                Err(e @ (BaseError::BlockCorrupt { .. } | BaseError::Io { .. })) => {
                    report.bad.push(format!("{}: {e}", hex::encode(h)))
                }
                Err(e) => return Err(e),
            }
        }
        let known: HashSet<BlockHash> = blocks.into_iter().map(|(h, _)| h).collect();
        self.index.range(Family::Dirents, b"K", b"L", |_, v| {
            if v.len() != 32 || !known.contains(<&BlockHash>::try_from(v).expect("32 bytes")) {
                report.missing += 1;
            }
            true
        })?;
        Ok(report)
    }
}
