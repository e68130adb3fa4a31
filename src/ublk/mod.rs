//! A ublk server for block volumes: /dev/ublkbN served by the daemon through the kernel's
//! ublk driver (one queue per CPU, each driven by its own io_uring; `libublk` speaks the
//! driver's protocol), for microVM and container hosts that want a volume as a real block
//! device, without the two kernel round trips of a loop device over a FUSE file.
//!
//! Requests map onto the volume's device as NBD's do: READ, WRITE (FUA honoured), FLUSH
//! (the store's WAL synced), DISCARD and WRITE_ZEROES (holes punched). The device is made
//! with user recovery (`UBLK_F_USER_RECOVERY_REISSUE`): when the daemon dies, or stops with
//! the device still attached, the kernel keeps /dev/ublkbN and holds its I/O; the next daemon
//! on the same data dir finds the device ([`leftovers`]), recovers it and the held requests
//! are reissued to it, so a filesystem on the device sees no error. Which volume a device
//! serves is in the driver's run file (`/run/ublksrvd/N.json`, libublk's), with the data dir.
//! `volume detach` deletes the device.
//!
//! `request` decodes a descriptor, `queue` runs one queue, `workers` carry requests out on
//! the store.

mod queue;
mod request;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{sys, UblkFlags};
use serde::{Deserialize, Serialize};

use crate::blockdev::BlockDevice;
use workers::Workers;

/// The driver's name for this server's devices.
const TARGET: &str = "tenantfs";
/// Requests in flight per queue.
const QUEUE_DEPTH: u16 = 64;
/// The largest request (each tag holds a buffer of this size, touched as used). Below the
/// volume's unlogged-write threshold (256 KiB), so every write goes through the store's WAL
/// into the kernel before it is acknowledged: a daemon killed and recovered loses no
/// acknowledged write, as the device never went away for the filesystem on it.
const IO_BUF_BYTES: u32 = 128 << 10;
const _: () = assert!((IO_BUF_BYTES as usize) < crate::volume::UNLOGGED_WRITE_MIN);
/// Device flags: recovery that reissues the requests a dead server held.
const DEVICE_FLAGS: u64 = (sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) as u64;
/// Where the driver's control device is.
const CONTROL: &str = "/dev/ublk-control";

#[derive(Debug, thiserror::Error)]
pub enum UblkServeError {
    #[error(
        "this kernel has no ublk driver ({CONTROL} is missing): load it (`modprobe ublk_drv`, \
         Linux >= 6.0 with CONFIG_BLK_DEV_UBLK), or attach over NBD (--nbd unix:PATH)"
    )]
    NoDriver,
    #[error("ublk {what} failed: {detail}")]
    Driver { what: &'static str, detail: String },
    #[error(
        "{path} is in use (a mounted filesystem or an open holder): unmount it or close it, \
         then detach"
    )]
    InUse { path: String },
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
}

fn driver(what: &'static str) -> impl FnOnce(libublk::UblkError) -> UblkServeError {
    move |e| UblkServeError::Driver {
        what,
        detail: format!("{e} ({e:?})"),
    }
}

/// Locks `m`, going on past a poisoned lock.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whose a device is, kept in the driver's run file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Owner {
    data_dir: PathBuf,
    volume: String,
}

/// A device a previous server of this data dir left for recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    pub dev_id: u32,
    pub volume: String,
}

/// A volume served as /dev/ublkbN.
pub struct UblkTarget {
    dev_id: u32,
    device: Arc<BlockDevice>,
    ctrl: Arc<UblkCtrl>,
    workers: Arc<Workers>,
    serving: Option<JoinHandle<()>>,
}

impl UblkTarget {
    /// Makes a new /dev/ublkbN for `device` (a volume of the data dir at `data_dir`).
    pub fn start(device: Arc<BlockDevice>, data_dir: &Path) -> Result<Self, UblkServeError> {
        check_driver()?;
        let queues = std::thread::available_parallelism().map_or(1, |n| n.get()) as u16;
        let ctrl = UblkCtrlBuilder::default()
            .name(TARGET)
            .nr_queues(queues)
            .depth(QUEUE_DEPTH)
            .io_buf_bytes(IO_BUF_BYTES)
            .ctrl_flags(DEVICE_FLAGS)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(driver("add device"))?;
        Self::serve(ctrl, device, data_dir)
    }

    /// Takes over device `dev_id` that a previous server left (see [`leftovers`]): its held
    /// requests are reissued to this one.
    pub fn recover(
        device: Arc<BlockDevice>,
        data_dir: &Path,
        dev_id: u32,
    ) -> Result<Self, UblkServeError> {
        check_driver()?;
        let old = UblkCtrl::new_simple(dev_id as i32).map_err(driver("open device"))?;
        // Waits (up to 30 s) for the driver to notice the old server is gone.
        let r = old.start_user_recover().map_err(driver("start recovery"))?;
        if r < 0 {
            return Err(UblkServeError::Driver {
                what: "start recovery",
                detail: std::io::Error::from_raw_os_error(-r).to_string(),
            });
        }
        let info = old.dev_info();
        drop(old);
        let ctrl = UblkCtrlBuilder::default()
            .name(TARGET)
            .id(dev_id as i32)
            .nr_queues(info.nr_hw_queues)
            .depth(info.queue_depth)
            .io_buf_bytes(info.max_io_buf_bytes)
            .ctrl_flags(DEVICE_FLAGS)
            .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
            .build()
            .map_err(driver("recover device"))?;
        Self::serve(ctrl, device, data_dir)
    }

    /// Starts the queues and the device; returns once /dev/ublkbN serves.
    fn serve(
        ctrl: UblkCtrl,
        device: Arc<BlockDevice>,
        data_dir: &Path,
    ) -> Result<Self, UblkServeError> {
        let ctrl = Arc::new(ctrl);
        let dev_id = ctrl.dev_info().dev_id;
        let workers = Arc::new(Workers::start(device.clone()).map_err(UblkServeError::Thread)?);
        let owner = serde_json::to_value(Owner {
            data_dir: data_dir.to_owned(),
            volume: device.name().to_owned(),
        })
        .expect("an owner serialises");
        let size = device.size();
        let (started_tx, started) = std::sync::mpsc::channel::<Result<(), String>>();
        let serving = {
            let (ctrl, workers) = (ctrl.clone(), workers.clone());
            std::thread::Builder::new()
                .name(format!("ublk-{dev_id}"))
                .spawn(move || {
                    if let Err(e) = control_ring() {
                        let _ = started_tx.send(Err(e.to_string()));
                        return;
                    }
                    let ready = started_tx.clone();
                    let q_workers = workers.clone();
                    let run = std::panic::AssertUnwindSafe(|| {
                        ctrl.run_target(
                            move |dev: &mut UblkDev| {
                                set_params(dev, size);
                                dev.set_target_json(owner);
                                Ok(())
                            },
                            move |qid, dev: &UblkDev| queue::serve(qid, dev, &q_workers),
                            move |_| {
                                let _ = ready.send(Ok(()));
                            },
                        )
                    });
                    let failed = match std::panic::catch_unwind(run) {
                        Ok(Ok(_)) => None,
                        Ok(Err(e)) => Some(format!("{e} ({e:?})")),
                        Err(panic) => Some(format!("libublk panicked: {}", panic_text(&panic))),
                    };
                    if let Some(detail) = failed {
                        tracing::error!(dev_id, %detail, "ublk device stopped");
                        let _ = started_tx.send(Err(detail));
                    }
                    workers.stop();
                })
                .map_err(UblkServeError::Thread)?
        };
        match started.recv() {
            Ok(Ok(())) => {}
            Ok(Err(detail)) => {
                return Err(UblkServeError::Driver {
                    what: "start device",
                    detail,
                })
            }
            Err(_) => {
                return Err(UblkServeError::Driver {
                    what: "start device",
                    detail: "the serving thread ended".into(),
                })
            }
        }
        tracing::info!(volume = device.name(), dev_id, "serving /dev/ublkb{dev_id}");
        Ok(Self {
            dev_id,
            device,
            ctrl,
            workers,
            serving: Some(serving),
        })
    }

    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// The block device's path, /dev/ublkbN.
    pub fn path(&self) -> String {
        format!("/dev/ublkb{}", self.dev_id)
    }

    pub fn device(&self) -> &Arc<BlockDevice> {
        &self.device
    }

    /// Deletes the device (`volume detach`): refused while it is mounted or held open
    /// exclusively; otherwise requests in flight are answered and the store synced.
    pub fn stop(&mut self) -> Result<(), UblkServeError> {
        let path = self.path();
        if crate::blockdev::is_held(&path) {
            return Err(UblkServeError::InUse { path });
        }
        control_ring()?;
        self.ctrl.kill_dev().map_err(driver("stop device"))?;
        if let Some(t) = self.serving.take() {
            let _ = t.join();
        }
        if let Err(error) = self.ctrl.del_dev() {
            tracing::warn!(path = %path, %error, "ublk device stopped but not deleted");
        }
        if let Err(error) = self.device.flush() {
            tracing::error!(volume = self.device.name(), %error, "cannot sync a detached volume");
        }
        Ok(())
    }

    /// Stops serving but keeps the device for the next server (daemon shutdown): requests
    /// being carried out finish, the store is synced, later requests stay held by the
    /// kernel until a server recovers the device.
    pub fn suspend(&mut self) {
        self.workers.suspend();
        if let Err(error) = self.device.flush() {
            tracing::error!(volume = self.device.name(), %error, "cannot sync a suspended volume");
        }
        // Dropping the control must not delete the device.
        self.ctrl.disown();
        tracing::info!(
            volume = self.device.name(),
            path = %self.path(),
            "kept for recovery by the next daemon"
        );
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Gives the calling thread libublk's control ring (per thread; a control made on one thread
/// and used on another needs one there too).
fn control_ring() -> Result<(), UblkServeError> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(
                io_uring_ublk::IoUring::<io_uring_ublk::squeue::Entry128>::builder()
                    .build(16)
                    .map_err(libublk::UblkError::IOError)?,
            );
        }
        Ok(())
    })
    .map_err(driver("control ring"))
}

fn check_driver() -> Result<(), UblkServeError> {
    if Path::new(CONTROL).exists() {
        Ok(())
    } else {
        Err(UblkServeError::NoDriver)
    }
}

/// The device's parameters: its size, 4 KiB physical blocks, a volatile cache with FUA (so
/// the kernel sends FLUSH and FUA writes), discard and write-zeroes.
fn set_params(dev: &mut UblkDev, size: u64) {
    dev.set_default_params(size);
    // Room in each queue's ring for every tag's command and the eventfd poll.
    let depth = dev.dev_info.queue_depth + 1;
    dev.tgt.sq_depth = depth;
    dev.tgt.cq_depth = depth;
    let p = &mut dev.tgt.params;
    p.basic.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
    p.discard = sys::ublk_param_discard {
        discard_alignment: 0,
        discard_granularity: 4096,
        max_discard_sectors: u32::MAX >> 9,
        max_write_zeroes_sectors: u32::MAX >> 9,
        max_discard_segments: 1,
        ..Default::default()
    };
}

/// The devices of this driver that a previous server of the data dir at `data_dir` left
/// (killed, or stopped with them attached): each is to be recovered by this one.
pub fn leftovers(data_dir: &Path) -> Vec<Leftover> {
    let Ok(entries) = std::fs::read_dir("/sys/class/ublk-char") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("ublkc"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(owner) = run_file_owner(id) else {
            continue;
        };
        if owner.data_dir == data_dir {
            found.push(Leftover {
                dev_id: id,
                volume: owner.volume,
            });
        }
    }
    found.sort_by_key(|l| l.dev_id);
    found
}

/// The owner recorded in device `id`'s run file, if it is one of ours.
fn run_file_owner(id: u32) -> Option<Owner> {
    let ctrl = UblkCtrl::new_simple(id as i32).ok()?;
    if ctrl.get_target_type_from_json().ok()? != TARGET {
        return None;
    }
    owner_of(&ctrl.get_target_data_from_json()?)
}

fn owner_of(target_data: &serde_json::Value) -> Option<Owner> {
    serde_json::from_value(target_data.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_read_back_and_other_targets_data_is_not_one() {
        let o = Owner {
            data_dir: "/var/lib/tenantfs".into(),
            volume: "v".into(),
        };
        assert_eq!(owner_of(&serde_json::to_value(&o).unwrap()), Some(o));
        assert_eq!(owner_of(&serde_json::json!({"backing_file": "/x"})), None);
    }

    #[test]
    fn no_driver_is_a_clear_error() {
        if Path::new(CONTROL).exists() {
            return; // a host with ublk: the VM tests cover it
        }
        let e = check_driver().unwrap_err().to_string();
        assert!(
            e.contains("modprobe ublk_drv") && e.contains("--nbd"),
            "{e}"
        );
        assert!(leftovers(Path::new("/nonexistent")).is_empty());
    }
}
