//! The agent's /metrics values, not just their names: every one of the 11 metrics documented
//! in docs/agent.md is read and checked against what the kernel says about the same things
//! (a fixture's CPU time from /proc, the agent's own CPU and RSS, the dying-cgroup count) and
//! against the sampling design (F x seconds x CPUs samples); the stack-copy counters against
//! programs started while the agent samples.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::{
    Agent, TempDir, cannot_run, cpu_seconds, exclusive, require_bpf, run_program,
};

const HZ: f64 = 49.0;
const WINDOW_S: f64 = 2.0;
const WINDOWS: f64 = 4.0;

/// `name{labels}` -> value, from the Prometheus text format.
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn rss_bytes(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading status");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    kb * 1024.0
}

/// The cgroup2 mount: /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid).
fn cgroup2_root() -> Option<&'static str> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .find(|root| Path::new(root).join("cgroup.procs").exists() && is_cgroup2(root))
}

fn is_cgroup2(root: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split(' ').nth(4) == Some(root) && l.contains(" - cgroup2 "))
    })
}

/// A fixture in a cgroup2 directory of its own, so its samples are told apart from anyone
/// else's with the same comm (other tests on the machine run the same fixtures). Killed, and
/// the directory removed, on drop.
struct CgroupFixture {
    dir: String,
    child: Option<Child>,
}

impl CgroupFixture {
    /// Starts `program 60` inside `<root>/<name>` once it has exec'd (its comm is `comm`).
    fn start(root: &str, name: &str, program: &str, comm: &str) -> Self {
        let dir = format!("{root}/{name}");
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {dir}: {e}"));
        let mut fixture = Self { dir, child: None };
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" 60",
                fixture.dir
            ))
            .arg(program)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting a fixture in its cgroup");
        let pid = child.id();
        fixture.child = Some(child);
        let start = Instant::now();
        while std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map_or(true, |c| c.trim_end() != comm)
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{comm} did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        fixture
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// The cgroup path as the metrics label it (relative to the cgroup2 root).
    fn path<'a>(&'a self, root: &str) -> &'a str {
        self.dir.strip_prefix(root).unwrap()
    }
}

impl Drop for CgroupFixture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One read of /metrics: the series and the text they came from (for the failure messages).
struct Scrape {
    m: BTreeMap<String, f64>,
    text: String,
}

impl Scrape {
    fn of(agent: &Agent) -> Self {
        let text = String::from_utf8_lossy(&agent.get("/metrics").1).into_owned();
        Scrape {
            m: parse(&text),
            text,
        }
    }

    /// A series that must be there.
    fn get(&self, series: &str) -> f64 {
        *self
            .m
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{}", self.text))
    }

    fn stored_windows(&self) -> f64 {
        self.m
            .get("profiler_windows_total{outcome=\"stored\"}")
            .copied()
            .unwrap_or(0.0)
    }

    /// The sum of every series of a labelled metric (`prefix` ends in `{`).
    fn sum(&self, prefix: &str) -> f64 {
        self.m
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    }
}

/// The two spinning fixtures: one in a plain cgroup, one in a cgroup named like a docker
/// container's scope.
struct Fixtures {
    host: CgroupFixture,
    boxed: CgroupFixture,
    /// The fake container's id (64 hex digits).
    id: String,
    started: Instant,
}

impl Fixtures {
    fn start(root: &str) -> Self {
        let me = std::process::id();
        let host = CgroupFixture::start(
            root,
            &format!("profiler-metrics-{me}"),
            env!("FIXTURE_FX_CHAIN"),
            "fx-chain",
        );
        let id = format!("{me:08x}{:056x}", 0xc0ffee);
        let boxed = CgroupFixture::start(
            root,
            &format!("docker-{id}.scope"),
            env!("CARGO_BIN_EXE_fixture-rust"),
            "fixture-rust",
        );
        Fixtures {
            host,
            boxed,
            id,
            started: Instant::now(),
        }
    }
}

/// What /proc says about the agent and the fixtures, read right after the scrape.
struct KernelFigures {
    agent_cpu: f64,
    agent_rss: f64,
    /// Seconds since the agent was started.
    since_spawn: f64,
    host_cpu: f64,
    boxed_cpu: f64,
    /// Seconds since the fixtures were started.
    fixture_wall: f64,
    cpus: f64,
}

impl KernelFigures {
    fn read(agent: &Agent, fixtures: &Fixtures, spawned: Instant) -> Self {
        let agent_cpu = cpu_seconds(agent.pid());
        let agent_rss = rss_bytes(agent.pid());
        let since_spawn = spawned.elapsed().as_secs_f64();
        let (host_cpu, boxed_cpu) = (
            cpu_seconds(fixtures.host.pid()),
            cpu_seconds(fixtures.boxed.pid()),
        );
        let fixture_wall = fixtures.started.elapsed().as_secs_f64();
        let cpus = std::thread::available_parallelism().unwrap().get() as f64;
        KernelFigures {
            agent_cpu,
            agent_rss,
            since_spawn,
            host_cpu,
            boxed_cpu,
            fixture_wall,
            cpus,
        }
    }
}

/// The agent at 49 Hz with 2 s windows, recording only the fixtures: the rest of the machine
/// counts as filtered, and its processes (other people's tests) are never opened.
fn start_agent(dir: &TempDir) -> Agent {
    Agent::start(
        &dir.file("data"),
        &[
            "--window",
            "2s",
            "-F",
            "49",
            "--comm",
            "fx-chain",
            "--comm",
            "fixture-rust",
        ],
    )
}

/// Scrapes /metrics until `WINDOWS` windows are stored (at most 120 s after `spawned`).
fn scrape_after_windows(agent: &Agent, spawned: Instant) -> Scrape {
    loop {
        let s = Scrape::of(agent);
        if s.stored_windows() >= WINDOWS {
            return s;
        }
        assert!(
            spawned.elapsed() < Duration::from_secs(120),
            "fewer than {WINDOWS} windows stored:\n{}",
            s.text
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The store's size in use: whole pages, and not zero once windows are stored. Windows: all
/// stored, none dropped. Nothing pushed without --push-url.
fn check_store_and_windows(s: &Scrape) {
    let text = &s.text;
    let used = s.get("profiler_store_used_bytes");
    assert!(
        used > 0.0 && used % 4096.0 == 0.0,
        "store bytes in use {used}: {text}"
    );
    assert_eq!(
        s.get("profiler_windows_total{outcome=\"dropped\"}"),
        0.0,
        "{text}"
    );
    assert_eq!(
        s.get("profiler_push_windows_total{outcome=\"sent\"}"),
        0.0,
        "{text}"
    );
    assert_eq!(
        s.get("profiler_push_windows_total{outcome=\"dropped\"}"),
        0.0,
        "{text}"
    );
}

/// Samples: F x seconds x CPUs, recorded or filtered (the idle task is sampled too, so every
/// CPU counts). The windows cover at least `covered` seconds and at most the time since the
/// agent started.
fn check_sample_counts(s: &Scrape, k: &KernelFigures, covered: f64) {
    let text = &s.text;
    let recorded = s.get("profiler_samples_total{outcome=\"recorded\"}");
    let filtered = s.get("profiler_samples_total{outcome=\"filtered\"}");
    let (low, high) = (
        0.8 * HZ * k.cpus * covered,
        1.1 * HZ * k.cpus * k.since_spawn,
    );
    assert!(
        recorded + filtered >= low && recorded + filtered <= high,
        "{recorded} samples recorded + {filtered} filtered; F x d x CPUs says {low:.0}..{high:.0}\n{text}"
    );
    // The rest of the machine, idle included, is filtered: there is some.
    assert!(filtered > 0.0, "nothing filtered with --comm\n{text}");
    // 49 Hz on 2 CPUs is far below what the ring buffer holds.
    assert_eq!(
        s.get("profiler_samples_lost_total{reason=\"ringbuf_full\"}"),
        0.0,
        "{text}"
    );
    for reason in ["kstack_failed", "ustack_failed"] {
        let n = s.get(&format!(
            "profiler_samples_lost_total{{reason=\"{reason}\"}}"
        ));
        assert!(
            n <= recorded * 0.05,
            "{n} samples {reason} of {recorded}\n{text}"
        );
    }
}

/// CPU seconds (samples / F) of each fixture's own cgroup: never more than the fixture really
/// used (plus sampling noise), and at least half of its share of the covered time. Its comm's
/// series holds at least as much (others may run the same fixture).
fn check_fixture_cpu(s: &Scrape, k: &KernelFigures, f: &Fixtures, root: &str, covered: f64) {
    let text = &s.text;
    for (comm, fixture, used) in [
        ("fx-chain", &f.host, k.host_cpu),
        ("fixture-rust", &f.boxed, k.boxed_cpu),
    ] {
        let path = fixture.path(root);
        let seen = s.get(&format!(
            "profiler_cgroup_cpu_seconds_total{{cgroup=\"{path}\"}}"
        ));
        let share = used / k.fixture_wall;
        let (low, high) = (0.5 * share * covered, 1.1 * used + 2.0 / HZ);
        assert!(
            seen >= low && seen <= high,
            "{comm} in {path}: {seen:.2} CPU s in the metric; it used {used:.2} s ({:.0}% of \
             a CPU), so {low:.2}..{high:.2}\n{text}",
            share * 100.0
        );
        let by_comm = s.get(&format!(
            "profiler_process_cpu_seconds_total{{comm=\"{comm}\"}}"
        ));
        assert!(
            by_comm >= seen - 1e-9,
            "{comm}: {by_comm} < its cgroup's {seen}\n{text}"
        );
    }
}

/// Only the two comms are recorded, so their seconds are all the recorded samples / F.
fn check_recorded_are_the_comms(s: &Scrape) {
    let recorded = s.get("profiler_samples_total{outcome=\"recorded\"}");
    let comm_sum = s.sum("profiler_process_cpu_seconds_total{");
    assert!(
        (comm_sum * HZ - recorded).abs() < 0.5,
        "{comm_sum} CPU s by comm is not {recorded} samples / {HZ} Hz\n{}",
        s.text
    );
}

/// The fake container: its 12-digit id carries exactly its cgroup's samples.
fn check_container(s: &Scrape, f: &Fixtures, root: &str) {
    let container = s.get(&format!(
        "profiler_container_cpu_seconds_total{{container=\"{}\"}}",
        &f.id[..12]
    ));
    let cgroup = s.get(&format!(
        "profiler_cgroup_cpu_seconds_total{{cgroup=\"{}\"}}",
        f.boxed.path(root)
    ));
    assert!(
        (cgroup - container).abs() <= 1e-9 && container > 0.0,
        "container {container} s, its cgroup {cgroup} s\n{}",
        s.text
    );
}

/// Memory-cgroup seconds are samples of that comm with a memcg function: at most its CPU, and
/// the fixtures, which only compute, have next to none.
fn check_memcg(s: &Scrape) {
    let text = &s.text;
    for (series, v) in
        s.m.iter()
            .filter(|(k, _)| k.starts_with("profiler_process_memcg_seconds_total{"))
    {
        let comm_series = series.replace(
            "profiler_process_memcg_seconds_total",
            "profiler_process_cpu_seconds_total",
        );
        let cpu = s.m.get(&comm_series).copied().unwrap_or(0.0);
        assert!(*v <= cpu + 1e-9, "{series} {v} > its CPU {cpu}\n{text}");
    }
    for comm in ["fx-chain", "fixture-rust"] {
        let memcg =
            s.m.get(&format!(
                "profiler_process_memcg_seconds_total{{comm=\"{comm}\"}}"
            ))
            .copied()
            .unwrap_or(0.0);
        assert!(
            memcg <= 2.0 / HZ,
            "{comm} spins in user space, yet {memcg} memcg s\n{text}"
        );
    }
}

/// Dying cgroups: the v2 series is cgroup2's nr_dying_descendants (other work on the machine
/// may create and remove cgroups meanwhile: a tenth or 20 either way).
fn check_dying_cgroups(s: &Scrape, root: &str) {
    let stat = std::fs::read_to_string(format!("{root}/cgroup.stat")).unwrap_or_default();
    let dying: f64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_dying_descendants "))
        .and_then(|v| v.trim().parse().ok())
        .expect("nr_dying_descendants in cgroup.stat");
    let v2 = s.get("profiler_dying_cgroups{controller=\"v2\"}");
    assert!(
        (v2 - dying).abs() <= 20.0 + dying * 0.1,
        "profiler_dying_cgroups v2 = {v2}, cgroup.stat says {dying}\n{}",
        s.text
    );
}

/// The agent's own CPU and RSS, as /proc shows them a moment later.
fn check_agent_itself(s: &Scrape, k: &KernelFigures) {
    let text = &s.text;
    let (agent_cpu, agent_rss) = (k.agent_cpu, k.agent_rss);
    let cpu = s.get("profiler_agent_cpu_seconds_total");
    assert!(
        cpu > 0.0 && cpu <= agent_cpu + 0.011 && cpu >= agent_cpu - 0.5,
        "agent CPU {cpu} s in the metric, {agent_cpu} s in /proc\n{text}"
    );
    let rss = s.get("profiler_agent_resident_memory_bytes");
    assert!(
        rss >= agent_rss * 0.75 && rss <= agent_rss * 1.25,
        "agent RSS {rss} B in the metric, {agent_rss} B in /proc\n{text}"
    );
}

#[test]
fn metric_values_match_the_kernel_and_the_design() {
    if !require_bpf() {
        return;
    }
    let Some(root) = cgroup2_root() else {
        cannot_run("no cgroup2 mount: the container and cgroup metrics cannot be checked");
        return;
    };
    let _serial = exclusive();
    let dir = TempDir::new("agent-metrics");
    let fixtures = Fixtures::start(root);
    let spawned = Instant::now();
    let mut agent = start_agent(&dir);
    let s = scrape_after_windows(&agent, spawned);
    let k = KernelFigures::read(&agent, &fixtures, spawned);
    let windows = s.get("profiler_windows_total{outcome=\"stored\"}");
    let covered = windows * WINDOW_S;
    eprintln!(
        "{windows} windows; fx-chain {:.2} s CPU, fixture-rust {:.2} s in {:.1} s; agent {:.2} \
         s CPU, {} B RSS\n{}",
        k.host_cpu, k.boxed_cpu, k.fixture_wall, k.agent_cpu, k.agent_rss, s.text
    );
    check_store_and_windows(&s);
    check_sample_counts(&s, &k, covered);
    check_fixture_cpu(&s, &k, &fixtures, root, covered);
    check_recorded_are_the_comms(&s);
    check_container(&s, &fixtures, root);
    check_memcg(&s);
    check_dying_cgroups(&s, root);
    check_agent_itself(&s, &k);
    assert!(agent.stop().success());
}

/// The stack-copy counters (docs/unwinding.md, Stack copies). A program started while the
/// agent samples is sampled before its tables are in the kernel: those samples come with a
/// copy of the user stack, which the agent walks with the same rows. fx-unwind has no frame
/// pointers and spends its time in Debian's libc (none either), so only those walks make its
/// first samples whole; run again and again for 50 ms, like a short job in a loop, most of
/// its samples are such first samples.
#[test]
fn stack_copies_of_programs_started_under_the_agent_are_counted_and_walked() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent-copies");
    // Under a comm of its own: other fx-unwind runs on the machine are not counted.
    let comm = format!("fxc-{}", std::process::id());
    let program = dir.path().join(&comm);
    std::fs::copy(env!("FIXTURE_FX_UNWIND"), &program).expect("copying fx-unwind");
    let mut agent = Agent::start(
        &dir.file("data"),
        &["--window", "2s", "-F", "99", "--comm", &comm],
    );
    for _ in 0..40 {
        let run = run_program(&program, &["0.05", "qsort"], Duration::from_secs(30));
        assert!(run.status.success(), "{comm} failed: {run:?}");
    }
    // The runs' samples are in the windows cut from now on: the second one holds the last
    // of them (a record waiting for its copy's tables waits at most 10 s at a window's end).
    let after_runs = Scrape::of(&agent).stored_windows();
    let waited = Instant::now();
    let s = loop {
        let s = Scrape::of(&agent);
        if s.stored_windows() >= after_runs + 2.0 {
            break s;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "no two windows stored after the runs:\n{}",
            s.text
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = &s.text;
    let sent = s.get("profiler_unwind_stack_copies_total");
    let refused = s.get("profiler_unwind_stack_copies_refused_total");
    let walked = s.get("profiler_unwind_stack_copies_walked_total");
    let truncated = s.sum("profiler_unwind_stack_copy_truncated_total{");
    let samples = s.get(&format!(
        "profiler_process_cpu_seconds_total{{comm=\"{comm}\"}}"
    )) * 99.0;
    eprintln!(
        "{comm}: {samples:.0} samples; copies {sent} sent, {refused} refused, {walked} walked, \
         {truncated} of those walks cut\n{text}"
    );
    assert!(
        samples >= 20.0,
        "only {samples:.0} samples of {comm}\n{text}"
    );
    // Every run's first samples were copied, and the agent walked them: the sampler's count
    // is of every process (the comm filter comes after), the walks only of the fixture's.
    assert!(walked > 0.0, "no stack copy walked\n{text}");
    assert!(
        sent >= walked,
        "{walked} copies walked of {sent} sent\n{text}"
    );
    assert!(
        walked <= samples + 0.5,
        "{walked} copies walked, more than {comm}'s {samples} samples\n{text}"
    );
    // Its copies' walks reach the entry: through Debian's libc without frame pointers.
    assert!(
        truncated * 10.0 <= walked,
        "{truncated} of {walked} walks of stack copies stopped before the entry\n{text}"
    );
    // And so do its samples' stacks (only the fixture's are kept): first samples included.
    let cut = s.sum("profiler_unwind_truncated_total{");
    assert!(
        cut * 10.0 <= samples,
        "{cut} of {comm}'s {samples:.0} samples' stacks stopped before the entry\n{text}"
    );
    assert!(agent.stop().success());
}

/// `--runq on`: /metrics has each CPU's run-queue waits as a Prometheus histogram (cumulative
/// buckets, +Inf equal to the count), and CPU 0's sum grows by at least what the kernel
/// counted of the waits of three threads that shared it meanwhile (`profiler-lab contend`).
#[test]
fn runqueue_histograms_hold_the_kernels_waits_per_cpu() {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let dir = TempDir::new("agent-runq");
    let agent = Agent::start(
        &dir.file("data"),
        &["--window", "1s", "-F", "19", "--runq", "on"],
    );
    let cpu0_sum = |text: &str| {
        parse(text)
            .get("profiler_runqueue_latency_seconds_sum{cpu=\"0\"}")
            .copied()
    };
    let scrape = || String::from_utf8_lossy(&agent.get("/metrics").1).into_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        if let Some(sum) = cpu0_sum(&scrape()) {
            break sum;
        }
        assert!(
            Instant::now() < deadline,
            "no run-queue histogram:\n{}",
            scrape()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let lab = run_program(
        Path::new(env!("CARGO_BIN_EXE_profiler-lab")),
        &["contend", "--cpu", "0", "--threads", "3", "--ms", "1000"],
        Duration::from_secs(60),
    );
    assert!(lab.status.success(), "profiler-lab contend: {lab:?}");
    let waited_s: f64 = String::from_utf8_lossy(&lab.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9;
    // Two cuts later the window with the lab's last waits is in.
    std::thread::sleep(Duration::from_millis(2500));
    let text = scrape();
    let after = cpu0_sum(&text).expect("the histogram of CPU 0");
    eprintln!(
        "CPU 0: {:.3} s of waits in the window, the contenders' {waited_s:.3} s",
        after - before
    );
    assert!(
        waited_s > 1.0 && after - before >= 0.98 * waited_s,
        "CPU 0's waits grew by {} s, the contenders alone waited {waited_s} s",
        after - before
    );
    // Cumulative buckets: non-decreasing with the bound, +Inf equal to the count.
    let prefix = "profiler_runqueue_latency_seconds_bucket{cpu=\"0\",le=\"";
    let mut buckets: Vec<(f64, f64)> = parse(&text)
        .into_iter()
        .filter_map(|(series, n)| {
            let le = series.strip_prefix(prefix)?.strip_suffix("\"}")?;
            Some((
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                },
                n,
            ))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.len() > 10, "{text}");
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    let count = parse(&text)["profiler_runqueue_latency_seconds_count{cpu=\"0\"}"];
    assert_eq!(buckets.last().unwrap().1, count, "+Inf is the count");
}
