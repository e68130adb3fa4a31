//! The harness: owns everything it starts (cgroup, daemon, mounts, load generator); Drop
//! cleans up, also on panic.

use super::*;

pub(super) struct Harness {
    pub(super) bin: PathBuf,
    pub(super) cg: Cgroup,
    pub(super) data: PathBuf,
    pub(super) cfg: PathBuf,
    pub(super) mp: PathBuf,
    pub(super) ws: PathBuf,
    pub(super) work: PathBuf,
    pub(super) daemon: Option<Child>,
    pub(super) loadgen: Option<Child>,
    pub(super) neighbour: Option<Child>,
    // Dropped last: the work dir.
    pub(super) _tmp: tempfile::TempDir,
}

impl Harness {
    pub(super) fn tenantfs(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.cfg)
            .args(args);
        c
    }

    pub(super) fn write_config(&self, direct_io: &str) {
        fs::write(
            &self.cfg,
            format!(
                "[store]\nwrite_buffers = \"64M\"\ndirect_io = \"{direct_io}\"\n\n\
                 [cache]\nbudget = \"{CACHE}\"\n\n[pressure]\ngovernor = true\n"
            ),
        )
        .unwrap();
        run_ok(&mut self.tenantfs(&["config", "check"]), "config check");
    }

    /// Starts the daemon in the cgroup (CPU 1) and mounts tenant `t` through it.
    pub(super) fn start_daemon(&mut self, direct_io: &str) {
        self.write_config(direct_io);
        let log = self.work.join(format!("daemon-{direct_io}.log"));
        let logf = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let data = self.data.to_string_lossy().into_owned();
        let cfg = self.cfg.to_string_lossy().into_owned();
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            &self.bin,
            &["--data-dir", &data, "--config", &cfg, "daemon"],
        )
        .env("TENANTFS_LOG", "info,tenantfs::store=debug")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("start daemon");
        self.daemon = Some(child);
        let start = Instant::now();
        loop {
            if let Some(st) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "daemon exited ({st}):\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let ok = self
                .tenantfs(&["stats"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "daemon not ready after 60 s"
            );
            sleep(Duration::from_millis(100));
        }
        let mp = self.mp.to_string_lossy().into_owned();
        run_ok(&mut self.tenantfs(&["mount", "t", &mp]), "mount");
        assert!(is_mounted(&self.mp), "{mp} not mounted");
    }

    /// What the daemon logged about the tenant store's I/O mode.
    pub(super) fn store_direct_io(&self, direct_io: &str) -> String {
        let log = fs::read_to_string(self.work.join(format!("daemon-{direct_io}.log")))
            .unwrap_or_default();
        log.lines()
            .rev()
            .find(|l| l.contains("opened tenant store") && l.contains("tenant=t"))
            .or_else(|| {
                log.lines()
                    .rev()
                    .find(|l| l.contains("opened tenant store"))
            })
            .and_then(|l| {
                let i = l.find("direct_io=")?;
                Some(l[i..].split_whitespace().next()?.to_string())
            })
            .unwrap_or_else(|| "direct_io=? (not logged)".into())
    }

    /// The governor's decisions logged by the daemon since byte `from` of its log: counts and
    /// the first shrink's reason.
    pub(super) fn governor_decisions(&self, direct_io: &str, from: u64) -> String {
        let log = fs::read(self.work.join(format!("daemon-{direct_io}.log"))).unwrap_or_default();
        let text = String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default());
        let shrinks: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("cache budget shrunk"))
            .collect();
        let grows = text
            .lines()
            .filter(|l| l.contains("cache budget grown"))
            .count();
        let first = shrinks
            .first()
            .and_then(|l| {
                Some(
                    l[l.find("reason=")?..]
                        .chars()
                        .take(200)
                        .collect::<String>(),
                )
            })
            .unwrap_or_default();
        format!(
            "governor: {} shrinks, {grows} grows{}{first}",
            shrinks.len(),
            if first.is_empty() { "" } else { "; first " }
        )
    }

    pub(super) fn log_len(&self, direct_io: &str) -> u64 {
        fs::metadata(self.work.join(format!("daemon-{direct_io}.log"))).map_or(0, |m| m.len())
    }

    pub(super) fn cache_budget(&self) -> String {
        let out = self.tenantfs(&["cache", "stats", "--json"]).output();
        let Ok(out) = out else { return "?".into() };
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Value = match serde_json::from_str(text.trim()) {
            Ok(v) => v,
            Err(_) => return "?".into(),
        };
        let mib = |k: &str| {
            v[k].as_u64()
                .map(|b| format!("{}", b / MIB))
                .unwrap_or_else(|| "?".into())
        };
        format!(
            "budget {} / ceiling {} MiB, used {} MiB, rss {} MiB",
            mib("budget_bytes"),
            mib("ceiling_bytes"),
            mib("used_bytes"),
            mib("process_rss_bytes")
        )
    }

    pub(super) fn stop_daemon(&mut self) {
        if is_mounted(&self.mp) {
            let mp = self.mp.to_string_lossy().into_owned();
            let st = self
                .tenantfs(&["umount", &mp])
                .stdout(Stdio::null())
                .status();
            if !matches!(st, Ok(s) if s.success()) {
                eprintln!("warning: tenantfs umount {mp} failed");
            }
        }
        if let Some(mut child) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let start = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(st)) => {
                        if !st.success() {
                            eprintln!("warning: daemon exited with {st}");
                        }
                        break;
                    }
                    Ok(None) if start.elapsed() < Duration::from_secs(30) => {
                        sleep(Duration::from_millis(50))
                    }
                    _ => {
                        eprintln!("warning: daemon did not exit on SIGTERM; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if is_mounted(&self.mp) {
            eprintln!("warning: {} still mounted; umount -l", self.mp.display());
            let _ = Command::new("umount").arg("-l").arg(&self.mp).status();
        }
    }

    /// Warms the fio working set into the page cache from inside the cgroup, so its pages are
    /// charged there.
    pub(super) fn warm_ws(&self) -> u64 {
        let ws = self.ws.to_string_lossy().into_owned();
        run_ok(
            &mut in_cgroup(
                &self.cg,
                TENANT_CPU,
                Path::new("dd"),
                &[&format!("if={ws}"), "of=/dev/null", "bs=1M"],
            ),
            "warm working set",
        );
        resident(&self.ws)
    }

    pub(super) fn start_loadgen(&mut self, secs: u64, out: &Path) {
        let file = self.mp.join("data.bin").to_string_lossy().into_owned();
        let out = format!("--output={}", out.display());
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            Path::new("fio"),
            &[
                "--name=loadgen",
                &format!("--filename={file}"),
                "--rw=randread",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=8",
                "--direct=1",
                &format!("--size={DATA_MIB}M"),
                "--time_based",
                &format!("--runtime={secs}"),
                "--output-format=json",
                &out,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start load generator");
        self.loadgen = Some(child);
    }

    /// A busy loop on the daemon's CPU, in the cgroup: CPU use without memory or I/O.
    pub(super) fn start_cpu_neighbour(&mut self) {
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            Path::new("sh"),
            &["-c", "while :; do :; done"],
        )
        .stdin(Stdio::null())
        .spawn()
        .expect("start busy loop");
        self.neighbour = Some(child);
    }

    /// The control for the daemon: a process on the daemon's CPU, in the cgroup, as busy as
    /// the daemon's CPU was under the load generator (`busy_pct`) and holding as much memory
    /// as the daemon did (`bytes`): this program's own `memcpy` mode ([`memcpy_control`]).
    pub(super) fn start_memcpy_neighbour(&mut self, bytes: u64, busy_pct: f64) {
        let me = std::env::current_exe().expect("current_exe");
        let child = in_cgroup(
            &self.cg,
            DAEMON_CPU,
            &me,
            &["memcpy", &bytes.to_string(), &format!("{busy_pct:.1}")],
        )
        .stdin(Stdio::null())
        .spawn()
        .expect("start memcpy control");
        self.neighbour = Some(child);
    }

    /// The daemon's resident memory (VmRSS), bytes.
    pub(super) fn daemon_rss(&self) -> u64 {
        let pid = self.daemon.as_ref().expect("daemon runs").id();
        fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().strip_suffix("kB"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .map_or(0, |kib| kib << 10)
    }

    pub(super) fn stop_cpu_neighbour(&mut self) {
        if let Some(mut c) = self.neighbour.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(super) fn wait_loadgen(&mut self) {
        if let Some(mut c) = self.loadgen.take() {
            let st = c.wait().expect("wait load generator");
            assert!(st.success(), "load generator failed: {st}");
        }
    }

    pub(super) fn fio_tenant(&self, secs: u64, out: &Path) -> FioResult {
        let ws = self.ws.to_string_lossy().into_owned();
        run_ok(
            &mut in_cgroup(
                &self.cg,
                TENANT_CPU,
                Path::new("fio"),
                &[
                    "--name=tenant",
                    &format!("--filename={ws}"),
                    "--rw=randread",
                    "--bs=4k",
                    "--ioengine=psync",
                    "--iodepth=1",
                    "--direct=0",
                    // Keep the warm page cache (fio drops the file's pages by default).
                    "--invalidate=0",
                    &format!("--size={WS_MIB}M"),
                    "--time_based",
                    &format!("--runtime={secs}"),
                    "--output-format=json",
                    &format!("--output={}", out.display()),
                ],
            ),
            "fio tenant",
        );
        fio_read_result(&fio_json(out))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(mut c) = self.loadgen.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stop_cpu_neighbour();
        self.stop_daemon();
        self.cg.remove();
    }
}
