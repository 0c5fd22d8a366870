//! The agent's HTTP routes. Every parameter is checked and bounded; a bad one is a 400 with
//! one line saying what is wrong.
use std::{rc::Rc, time::Duration};

use super::{
    State,
    sampler::{MAX_TAPS, TapRequest},
    time_ago,
};
use crate::{
    http::{Request, Response},
    output,
    profile::{GroupBy, Profile, lifecycle::json::ProgramJson},
    store::{Query, ReadLimits, Store, StoreError},
    util::unix_now_ns,
};

/// Longest range the store endpoints read.
pub(super) const MAX_RANGE: Duration = Duration::from_secs(31 * 24 * 3600);
/// Longest fresh profile /debug/pprof/profile records, s.
pub(super) const MAX_PPROF_SECONDS: u64 = 60;
/// Store reads (flame graphs, heat maps) running at once; more are a 503 with Retry-After.
pub(super) const MAX_HEAVY: usize = 2;
/// What one API request may read from the store: with `MAX_HEAVY` of them at once this
/// keeps the agent within a node agent's memory (about 40 MB of samples each), whatever the
/// span asked for. `profiler query` reads more (`ReadLimits::QUERY`).
pub(super) const API_LIMITS: ReadLimits = ReadLimits {
    max_samples: 1_000_000,
    max_stacks: 200_000,
};
/// Seconds a client is asked to wait when every heavy slot is taken.
const RETRY_AFTER_S: u32 = 5;

pub(crate) async fn handle(state: Rc<State>, req: Request) -> Response {
    let result = match req.path.as_str() {
        "/healthz" => only(&req, &[]).map(|()| match &*state.shared.store_problem() {
            None => Response::ok("text/plain", b"ok\n".to_vec()),
            Some(problem) => Response::text(503, problem),
        }),
        "/metrics" => only(&req, &[]).map(|()| {
            super::count_pushes(&state.shared, &state.pushers);
            let body = state.shared.metrics().render();
            Response::ok(
                "text/plain; version=0.0.4; charset=utf-8",
                body.into_bytes(),
            )
        }),
        "/debug/pprof/profile" => pprof(&state, &req).await,
        "/api/flamegraph" => stored(&state, &req, true).await,
        "/api/heatmap" => stored(&state, &req, false).await,
        "/api/programs" => only(&req, &[]).map(|()| programs(&state)),
        _ => Err(Response::text(
            404,
            "not found; try /healthz, /metrics, /debug/pprof/profile, /api/flamegraph, \
             /api/heatmap, /api/programs",
        )),
    };
    result.unwrap_or_else(|r| r)
}

/// The last window's programs, crash loops first, one object each as `doctor --json` has
/// them.
fn programs(state: &State) -> Response {
    #[derive(serde::Serialize)]
    struct Programs<'a> {
        /// "cgroup" (places, as the doctor groups) or "supervisor" (no cgroup tracing).
        grouped_by: &'static str,
        programs: Vec<ProgramJson<'a>>,
    }
    let m = state.shared.metrics();
    let body = Programs {
        grouped_by: if m.programs_by_cgroup {
            "cgroup"
        } else {
            "supervisor"
        },
        programs: m.programs.iter().map(ProgramJson::from).collect(),
    };
    Response::ok(
        "application/json",
        serde_json::to_vec(&body).expect("plain data serializes"),
    )
}

/// Rejects parameters outside `known`: a typo should not silently mean the default.
fn only(req: &Request, known: &[&str]) -> Result<(), Response> {
    match req.query.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        Some((k, _)) => Err(bad(&format!(
            "unknown parameter `{k}`{}",
            if known.is_empty() {
                String::new()
            } else {
                format!("; known: {}", known.join(", "))
            }
        ))),
        None => Ok(()),
    }
}

fn bad(message: &str) -> Response {
    Response::text(400, message)
}

/// `?seconds=N` (default 30, 1..=60): the next N seconds of the running sampler (at the
/// agent's rate) as pprof. Requests at once share the sampler; none loads another.
async fn pprof(state: &State, req: &Request) -> Result<Response, Response> {
    only(req, &["seconds"])?;
    let secs = match req.param("seconds") {
        None => 30,
        Some(s) => match s.parse::<u64>() {
            Ok(n @ 1..=MAX_PPROF_SECONDS) => n,
            _ => {
                return Err(bad(&format!(
                    "seconds must be a whole number in 1..={MAX_PPROF_SECONDS}, got `{s}`"
                )));
            }
        },
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = TapRequest {
        duration: Duration::from_secs(secs),
        reply,
    };
    if state.taps.try_send(request).is_err() {
        state.shared.metrics().pipeline.pprof_refused += 1;
        return Err(Response::busy(
            &format!("{MAX_TAPS} profiles are being taken already; try again later"),
            RETRY_AFTER_S,
        ));
    }
    let profile = match answer.await {
        Ok(Ok(p)) => p,
        Ok(Err(why)) => return Err(Response::busy(&why.to_string(), RETRY_AFTER_S)),
        Err(_) => return Err(Response::text(503, "the agent is stopping")),
    };
    // Encoding takes a while for a long profile: off the thread that serves HTTP.
    let body = tokio::task::spawn_blocking(move || {
        let mut body = Vec::new();
        output::write_pprof(&profile, &mut body).map(|()| body)
    })
    .await
    .map_err(|e| Response::text(500, &format!("encoding failed: {e}")))?
    .map_err(|e| Response::text(500, &format!("encoding failed: {e}")))?;
    Ok(Response::ok("application/octet-stream", body))
}

/// `?since=&until=&comm=` from the store, as a flame graph (SVG) or the heat-map page.
async fn stored(state: &State, req: &Request, flamegraph: bool) -> Result<Response, Response> {
    only(req, &["since", "until", "comm", "cgroup"])?;
    let now = unix_now_ns();
    let at = |name: &str, default: &str| {
        let text = req.param(name).unwrap_or(default);
        time_ago(text, now).map_err(|e| bad(&format!("{name}: {}", crate::util::chain(&e))))
    };
    let (since, until) = (at("since", "10m")?, at("until", "now")?);
    if since >= until {
        return Err(bad("since must be before until"));
    }
    if until - since > MAX_RANGE.as_nanos() as u64 {
        return Err(bad("the range may span at most 31 days"));
    }
    let query = Query {
        since_unix_ns: since,
        until_unix_ns: until,
        comms: req
            .param("comm")
            .map(|c| vec![c.to_owned()])
            .unwrap_or_default(),
        cgroup: req.param("cgroup").map(str::to_owned),
    };
    let dir = state.config.data_dir.clone();
    let _slot = HeavySlot::take(state)?;
    // Reading and rendering can take a while: off the sampling thread.
    let rendered = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, Response> {
        let profile: Profile = Store::open_read(&dir)
            .and_then(|s| s.read_bounded(&query, API_LIMITS))
            .map_err(|e| match e {
                e @ StoreError::TooBig { .. } => bad(&e.to_string()),
                e => Response::text(500, &crate::util::chain(&e)),
            })?;
        if profile.samples.is_empty() {
            return Err(Response::text(404, "no samples stored in that range"));
        }
        let mut body = Vec::new();
        if flamegraph {
            output::write_svg(&profile, GroupBy::Comm, &mut body)
        } else {
            output::write_heatmap(&profile, &mut body)
        }
        .map_err(|e| match e.kind() {
            // The span is longer than a page can show: the caller's range, not our fault.
            std::io::ErrorKind::InvalidInput => bad(&e.to_string()),
            _ => Response::text(500, &format!("rendering failed: {e}")),
        })?;
        Ok(body)
    })
    .await
    .map_err(|e| Response::text(500, &format!("rendering failed: {e}")))??;
    let kind = if flamegraph {
        "image/svg+xml"
    } else {
        "text/html; charset=utf-8"
    };
    Ok(Response::ok(kind, rendered))
}

/// One of the `MAX_HEAVY` slots for a store read, given back on drop (on every return path).
struct HeavySlot<'a>(&'a State);

impl<'a> HeavySlot<'a> {
    fn take(state: &'a State) -> Result<Self, Response> {
        if state.heavy.get() >= MAX_HEAVY {
            return Err(Response::busy(
                &format!(
                    "{MAX_HEAVY} store reads are running already; try again in {RETRY_AFTER_S} s"
                ),
                RETRY_AFTER_S,
            ));
        }
        state.heavy.set(state.heavy.get() + 1);
        Ok(Self(state))
    }
}

impl Drop for HeavySlot<'_> {
    fn drop(&mut self) {
        self.0.heavy.set(self.0.heavy.get() - 1);
    }
}
