//! From findings to a verdict: thresholds (documented in docs/doctor.md), the problems with
//! their evidence, and remedies that name the cgroup, the creator and the command.
use super::Findings;
use crate::cgroups::{MemorySubtree, V2Memory};
use crate::profile::memcg::MemcgShare;

/// Dying cgroups of one controller worth a warning: more than a host's own trickle.
pub(crate) const DYING_WARN: u64 = 100;
/// Dying cgroups that make an alarm on their own: statistics reads and reclaim now walk
/// hundreds of memcgs.
pub(crate) const DYING_ALARM: u64 = 400;
/// A process is "hot in memcg code" with at least this share of its CPU there, percent...
pub(crate) const MEMCG_SHARE_HOT: f64 = 20.0;
/// ...and at least this share of one CPU over the window, percent (ignores idle processes).
pub(crate) const MEMCG_CPU_HOT: f64 = 10.0;
/// cgroup creations per second by one process worth naming as churn.
pub(crate) const CHURN_RATE_WARN: f64 = 1.0;
/// A CPU this busy, percent, is saturated.
pub(crate) const CPU_SATURATED: f64 = 90.0;
/// A thread that waited this long for a CPU, s, is starved: a warning (a driver's softirq
/// or a NAPI thread that waits this long drops packets, a watchdog may fire)...
pub(crate) const STARVED_WARN: f64 = 0.1;
/// ...and an alarm from this long (network drivers' transmit watchdogs fire from 5 s; RCU
/// stall warnings from 21 s).
pub(crate) const STARVED_ALARM: f64 = 1.0;

/// How bad.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Healthy,
    Warning,
    Alarm,
}

impl Level {
    /// `profiler doctor`'s exit status for this verdict (docs/doctor.md): 0 healthy, 3 a
    /// warning, 4 an alarm (1 is a failure to run, 2 a bad command line).
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Level::Healthy => 0,
            Level::Warning => 3,
            Level::Alarm => 4,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Healthy => "healthy",
            Level::Warning => "warning",
            Level::Alarm => "alarm",
        }
    }
}

/// The doctor's conclusion.
#[derive(Clone, Debug)]
pub(crate) struct Verdict {
    pub level: Level,
    /// One line per problem found.
    pub problems: Vec<String>,
    /// What to do, most direct first.
    pub remedies: Vec<String>,
    /// The memory cgroup judged to hold the dying memcgs: v1 see `holder`, cgroup2 see
    /// `cgroups::V2Memory::holder`.
    pub holder: Option<String>,
}

/// memcg CPU of a share as percent of one CPU over the window.
pub(crate) fn cpu_percent(share: &MemcgShare, f: &Findings) -> f64 {
    let ticks = f.samples_per_cpu_window();
    if ticks <= 0.0 {
        0.0
    } else {
        share.memcg_samples as f64 * 100.0 / ticks
    }
}

impl Findings {
    /// Expected samples of one fully busy CPU over the window.
    pub(crate) fn samples_per_cpu_window(&self) -> f64 {
        f64::from(self.frequency_hz) * self.duration_s
    }

    /// Processes hot in memcg code (see `MEMCG_SHARE_HOT`, `MEMCG_CPU_HOT`).
    pub(crate) fn hot_memcg(&self) -> Vec<&MemcgShare> {
        self.memcg
            .iter()
            .filter(|s| s.percent() >= MEMCG_SHARE_HOT && cpu_percent(s, self) >= MEMCG_CPU_HOT)
            .collect()
    }

    /// Processes creating cgroups at `CHURN_RATE_WARN` or faster.
    pub(crate) fn churners(&self) -> Vec<&crate::bpf::churn::ChurnCount> {
        self.churn
            .iter()
            .filter(|c| self.churn_rate(c) >= CHURN_RATE_WARN)
            .collect()
    }

    /// cgroups `c` created per second of the window (the verdict, the text and the JSON).
    pub(crate) fn churn_rate(&self, c: &crate::bpf::churn::ChurnCount) -> f64 {
        c.mkdirs as f64 / self.duration_s.max(0.001)
    }
}

/// Who made a crash loop's cgroup: the process that creates cgroups beside it (under the same
/// parent), its supervisor or starter first. A service manager (systemd, containerd, a
/// supervisor) creates the cgroup anew on every restart; it is the creator, not the cause.
pub(crate) fn creator<'a>(
    p: &crate::profile::lifecycle::Program,
    churn: &'a [crate::bpf::churn::ChurnCount],
) -> Option<&'a crate::bpf::churn::ChurnCount> {
    let parent = place_parent(&p.cgroup)?;
    let beside = |c: &&crate::bpf::churn::ChurnCount| {
        c.mkdirs > 0 && c.parents.iter().any(|(path, _)| path == parent)
    };
    let keeper = p.supervisor.as_ref().map(|s| s.0);
    let starter = p.parents.first().map(|s| s.0);
    churn
        .iter()
        .filter(beside)
        .find(|c| Some(c.pid) == keeper || Some(c.pid) == starter)
        .or_else(|| churn.iter().find(beside))
}

/// The parent of a cgroup place (`/zsvc` of `/zsvc/run-*`), if it has one.
fn place_parent(place: &str) -> Option<&str> {
    match place.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&place[..i]),
        None => None,
    }
}

/// One line naming a crash loop, its cause, who restarts it and the churn that costs (for
/// problems and the text report).
pub(crate) fn crash_loop_line(p: &crate::profile::lifecycle::Program, f: &Findings) -> String {
    let place = match p.cgroups_seen {
        0 | 1 => p.cgroup.clone(),
        n => format!("{} (a new one each time: {n} cgroups)", p.cgroup),
    };
    let mut line = format!(
        "{} in cgroup {} exited with {} and was restarted {} times in {:.1} s ({:.0}/min, {} failing exits), median life {}",
        p.name(),
        place,
        p.failing_status().unwrap_or("a failure"),
        p.starts(),
        f.duration_s,
        p.starts_per_min,
        p.failing,
        p.median_lifetime_ns
            .map_or("unknown".to_owned(), |ns| format!(
                "{:.1} ms",
                ns as f64 / 1e6
            ))
    );
    if let Some(s) = p.started_by() {
        line.push_str(&format!("; {s}"));
    }
    if let Some(c) = creator(p, &f.churn) {
        line.push_str(&format!("; {}", churn_caused(p, c, f.duration_s)));
    }
    if let Some(growth) = dying_growth(f) {
        line.push_str(&format!("; {growth}"));
    }
    line
}

/// The churn a crash loop causes, from its creator's counts: `zsuper (pid 10) restarts it in
/// a new cgroup under /zsvc each time: 378 new cgroups a minute; it created 378 and removed
/// 378 a minute in all (through mkdir x30, rmdir x30)`. "In all" counts every hierarchy (a
/// runtime makes a container's cgroup in each v1 hierarchy) and every other cgroup it made.
fn churn_caused(
    p: &crate::profile::lifecycle::Program,
    c: &crate::bpf::churn::ChurnCount,
    duration_s: f64,
) -> String {
    let per_min = |n: u64| n as f64 * 60.0 / duration_s.max(0.001);
    let (made, removed) = (per_min(c.mkdirs), per_min(c.rmdirs));
    let how = match p.cgroups_seen {
        0 | 1 => "making its cgroup anew each time:".to_owned(),
        n => format!(
            "in a new cgroup under {} each time: {:.0} new cgroups a minute;",
            place_parent(&p.cgroup).unwrap_or("/"),
            per_min(n as u64)
        ),
    };
    format!(
        "{} (pid {}) restarts it {how} it created {made:.0} and removed {removed:.0} cgroups a minute in all{}",
        c.comm,
        c.pid,
        via(c)
    )
}

/// ` (through mkdir, rmdir)`: the helpers a churner's counts came through, if any.
pub(crate) fn via(c: &crate::bpf::churn::ChurnCount) -> String {
    if c.via.is_empty() {
        return String::new();
    }
    let helpers: Vec<String> = c
        .via
        .iter()
        .map(|(comm, n)| format!("{comm} x{n}"))
        .collect();
    format!(" (through {})", helpers.join(", "))
}

/// `+54 dying memory cgroups in 15.0 s: ~13,000 an hour ...`, when the count grew.
pub(crate) fn dying_growth(f: &Findings) -> Option<String> {
    let (start, end) = f.dying_memory?;
    let grown = end.checked_sub(start).filter(|g| *g > 0)?;
    let per_hour = grown as f64 * 3600.0 / f.duration_s.max(0.001);
    Some(format!(
        "+{grown} dying memory cgroups in {:.1} s (now {end}): ~{} an hour while their page \
         cache stays charged",
        f.duration_s,
        round_figure(per_hour)
    ))
}

/// A projection rounded to what it can claim: two significant digits, thousands separated.
fn round_figure(x: f64) -> String {
    let digits = x.max(1.0).log10().floor() as i32;
    let unit = 10f64.powi((digits - 1).max(0));
    let n = ((x / unit).round() * unit) as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The v1 memory cgroup most likely holding the dying memcgs: the cache holder under which a
/// churning process makes cgroups, else the top-ranked holder.
pub(crate) fn holder<'a>(
    f: &'a Findings,
    churners: &[&crate::bpf::churn::ChurnCount],
) -> Option<&'a crate::cgroups::CacheHolder> {
    let holders = &f.cgroups.cache_holders;
    churners
        .iter()
        .flat_map(|c| c.parents.iter())
        .filter(|(p, _)| p.len() > 1)
        .find_map(|(p, _)| {
            holders
                .iter()
                .find(|h| h.path.to_string_lossy().ends_with(p.as_str()))
        })
        .or_else(|| holders.first())
}

const DROP_CACHES: &str = "sync; echo 1 > /proc/sys/vm/drop_caches";

/// The host-wide remedy, v1 or v2.
fn drop_caches() -> String {
    format!("{DROP_CACHES}   # host-wide: frees all clean page cache, and with it the dying memcgs")
}

/// `N dying memory cgroups on cgroup2 (...)`, naming the subtree that holds most of them.
fn v2_problem(m: &V2Memory) -> String {
    let mut line = format!(
        "{} dying memory cgroups on cgroup2 ({} of {}/cgroup.stat)",
        m.dying,
        m.source,
        m.mount.display()
    );
    if let Some(h) = &m.holder {
        line.push_str(&format!(", {} of them under {}", h.dying, h.path.display()));
    }
    line
}

/// cgroup2 has no memory.force_empty; memory.reclaim (Linux 5.19+) reclaims what is charged
/// at and below a cgroup, the dying memcgs' page cache included.
fn v2_reclaim(h: &MemorySubtree) -> String {
    match h.file_bytes.filter(|b| *b > 0) {
        Some(bytes) => format!(
            "echo {bytes} > {}/memory.reclaim   # reclaims the {:.1} MiB of page cache charged \
             below it, which keeps its {} dying memcgs alive (Linux 5.19+)",
            h.path.display(),
            bytes as f64 / f64::from(1 << 20),
            h.dying
        ),
        None => format!(
            "echo 1G > {}/memory.reclaim   # reclaims page cache charged below it, which keeps \
             its {} dying memcgs alive (Linux 5.19+)",
            h.path.display(),
            h.dying
        ),
    }
}

/// Judges the findings: each rule below adds its problems and remedies and raises the level.
pub(crate) fn judge(f: &Findings) -> Verdict {
    let mut v = Verdict {
        level: Level::Healthy,
        problems: Vec::new(),
        remedies: Vec::new(),
        holder: None,
    };
    // A v2-only host has no v1 controller to count: its dying memcgs come per subtree.
    let dying = f
        .cgroups
        .controllers
        .iter()
        .map(|c| c.dying)
        .max()
        .unwrap_or(0)
        .max(f.cgroups.v2_memory.as_ref().map_or(0, |m| m.dying));
    let churners = f.churners();
    v.judge_v1_dying(f, &churners);
    v.judge_v2_dying(f);
    v.judge_hot_pollers(f, dying);
    v.judge_churners(f, &churners, dying);
    v.judge_kernel_log(f);
    v.judge_starved(f);
    let loops = v.judge_crash_loops(f);
    if dying >= DYING_WARN && churners.is_empty() && loops == 0 {
        v.remedies.push(
            "no process made cgroups in this window: the creator may be periodic (a \
             crash-looping unit); run a longer window, e.g. --duration 60s"
                .to_owned(),
        );
    }
    v
}

/// The level `dying` cgroups of one controller make on their own.
fn dying_level(dying: u64) -> Level {
    if dying >= DYING_ALARM {
        Level::Alarm
    } else {
        Level::Warning
    }
}

impl Verdict {
    fn raise(&mut self, level: Level) {
        self.level = self.level.max(level);
    }

    /// The v1 controller with the most dying cgroups; for memory, the holder's force_empty
    /// and the host-wide drop_caches.
    fn judge_v1_dying(&mut self, f: &Findings, churners: &[&crate::bpf::churn::ChurnCount]) {
        let worst = f.cgroups.controllers.iter().max_by_key(|c| c.dying);
        let Some(c) = worst.filter(|c| c.dying >= DYING_WARN) else {
            return;
        };
        self.raise(dying_level(c.dying));
        self.problems.push(format!(
            "{} dying {} cgroups ({} counted, {} live)",
            c.dying, c.controller, c.num_cgroups, c.live
        ));
        if c.controller == "memory" || f.cgroups.dying("memory").unwrap_or(0) >= DYING_WARN {
            if let Some(h) = holder(f, churners) {
                self.holder = Some(h.path.display().to_string());
                self.remedies.push(format!(
                    "echo 0 > {}/memory.force_empty   # reclaims the {:.1} MiB of page cache \
                     that keeps the dying memcgs below it alive",
                    h.path.display(),
                    h.unexplained() as f64 / f64::from(1 << 20)
                ));
            }
            self.remedies.push(drop_caches());
        }
    }

    /// Dying memcgs on cgroup2; the holder's memory.reclaim and drop_caches (once).
    fn judge_v2_dying(&mut self, f: &Findings) {
        let Some(m) = f
            .cgroups
            .v2_memory
            .as_ref()
            .filter(|m| m.dying >= DYING_WARN)
        else {
            return;
        };
        self.raise(dying_level(m.dying));
        self.problems.push(v2_problem(m));
        if let Some(h) = &m.holder {
            self.holder = Some(h.path.display().to_string());
            self.remedies.push(v2_reclaim(h));
        }
        if !self.remedies.iter().any(|r| r.starts_with(DROP_CACHES)) {
            self.remedies.push(drop_caches());
        }
    }

    /// Processes hot in memcg code: an alarm beside dying cgroups, else a warning.
    fn judge_hot_pollers(&mut self, f: &Findings, dying: u64) {
        for s in f.hot_memcg() {
            self.raise(if dying >= DYING_WARN {
                Level::Alarm
            } else {
                Level::Warning
            });
            self.problems.push(format!(
                "{} (pid {}) spends {:.0}% of its CPU in memory-cgroup kernel code ({})",
                s.comm,
                s.pid,
                s.percent(),
                s.top_function()
            ));
            self.remedies.push(format!(
                "poll memory statistics less often in {} (kubelet: --housekeeping-interval)",
                s.comm
            ));
        }
    }

    /// Processes making cgroups fast; named as the cause when cgroups are dying.
    fn judge_churners(
        &mut self,
        f: &Findings,
        churners: &[&crate::bpf::churn::ChurnCount],
        dying: u64,
    ) {
        for c in churners {
            self.raise(Level::Warning);
            self.problems.push(format!(
                "{} (pid {}) creates {:.1} cgroups/s",
                c.comm,
                c.pid,
                f.churn_rate(c)
            ));
            if dying >= DYING_WARN {
                self.remedies.push(format!(
                    "stop or fix {} (pid {}): it makes and removes cgroups under {}, and each one \
                     removed with page cache charged stays dying",
                    c.comm,
                    c.pid,
                    c.parents.first().map_or("?", |p| p.0.as_str())
                ));
            }
        }
    }

    /// Each starvation symptom the kernel logged is a warning.
    fn judge_kernel_log(&mut self, f: &Findings) {
        for line in &f.timeline {
            self.raise(Level::Warning);
            self.problems.push(format!("the kernel logged: {line}"));
        }
    }

    /// Threads that waited long for a CPU, linked to who held it and to what else we know
    /// of that program (its memcg share, a crash loop it belongs to).
    fn judge_starved(&mut self, f: &Findings) {
        // One remedy per program and CPU it held, naming every thread that waited there.
        let mut held: Vec<((u32, u32), &str, Vec<&str>)> = Vec::new();
        for s in f.starved.iter().flatten() {
            self.raise(if s.wait_s >= STARVED_ALARM {
                Level::Alarm
            } else {
                Level::Warning
            });
            self.problems.push(starved_line(s, f));
            if let Some(h) = s.instead.first() {
                match held.iter_mut().find(|(key, _, _)| *key == (h.pid, s.cpu)) {
                    Some((_, _, waiters)) => waiters.push(&s.comm),
                    None => held.push(((h.pid, s.cpu), &h.comm, vec![&s.comm])),
                }
            }
        }
        for ((pid, cpu), comm, waiters) in held {
            let waiters = waiters.join(", ");
            self.remedies.push(format!(
                "{comm} (pid {pid}) held CPU {cpu} while {waiters} waited: limit it (its \
                 cgroup's cpu.max, a lower priority or no real-time class), or move the \
                 waiting work off CPU {cpu} (taskset, irq affinity)"
            ));
        }
    }

    /// Crash loops are alarms, with the program as root cause and its manager as creator.
    /// Returns how many there are.
    fn judge_crash_loops(&mut self, f: &Findings) -> usize {
        let loops: Vec<_> = f.programs.iter().filter(|p| p.crash_loop).collect();
        for p in &loops {
            self.raise(Level::Alarm);
            self.problems
                .push(format!("crash loop: {}", crash_loop_line(p, f)));
            self.remedies.push(crash_loop_remedy(p, f));
        }
        loops.len()
    }
}

/// `ksoftirqd/1 (tid 20) waited up to 2.3 s for CPU 1 at 4.1 s while kubelet (pid 7) ran
/// mem_cgroup_nr_lru_pages there (87% of CPU 1); kubelet spends 62% of its CPU in
/// memory-cgroup kernel code`.
pub(crate) fn starved_line(s: &super::Starved, f: &Findings) -> String {
    let mut line = format!(
        "{} (tid {}) waited up to {:.2} s for CPU {} at {:.1} s",
        s.comm, s.tid, s.wait_s, s.cpu, s.at_s
    );
    let Some(h) = s.instead.first() else {
        line.push_str(" (no busy samples there meanwhile: raise -F)");
        return line;
    };
    line.push_str(&format!(
        " while {} (pid {}) ran {} there ({:.0}% of CPU {})",
        h.comm,
        h.pid,
        h.function,
        h.percent(),
        s.cpu
    ));
    if let Some(m) = f.hot_memcg().into_iter().find(|m| m.pid == h.pid) {
        line.push_str(&format!(
            "; {} spends {:.0}% of its CPU in memory-cgroup kernel code",
            m.comm,
            m.percent()
        ));
    }
    if let Some(p) = f.programs.iter().find(|p| p.crash_loop && p.comm == h.comm) {
        line.push_str(&format!(
            "; it is in a crash loop: {}",
            crash_loop_line(p, f)
        ));
    }
    line
}

/// `root cause: PROGRAM keeps failing ...`: fix the program, or stop it in its manager.
fn crash_loop_remedy(p: &crate::profile::lifecycle::Program, f: &Findings) -> String {
    let manager = creator(p, &f.churn)
        .map(|c| format!("{} (pid {})", c.comm, c.pid))
        .or_else(|| p.parents.first().map(|s| format!("{} (pid {})", s.1, s.0)))
        .unwrap_or_else(|| "its service manager".to_owned());
    let unit = p.cgroup.rsplit('/').next().unwrap_or("");
    let stop = if unit.ends_with(".service") {
        format!("`systemctl stop {unit}` or ")
    } else {
        String::new()
    };
    format!(
        "root cause: {} keeps failing ({}); {manager} only restarts it, making {} anew each time. Fix its failure, or {stop}stop it in {manager}",
        p.name(),
        p.failing_status().unwrap_or("a failure"),
        p.cgroup
    )
}

#[cfg(test)]
mod tests;
