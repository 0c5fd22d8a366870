#!/bin/busybox sh
# /init of the kernel matrix's initramfs (xtask/src/kernels): mounts what the profiler needs,
# runs the smoke suite against the kernel it booted on and reports on the serial console.
#
# Protocol, one line each, read by xtask/src/kernels/report.rs:
#   MATRIX-INFO <key> <value>
#   MATRIX <test> PASS|FAIL <one-line detail>
#   MATRIX-LOG <test> <a line of the failed command's stderr (verifier logs land here)>
#   MATRIX-END
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mkdir -p /proc /sys /dev /tmp /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
# What the profiler reads beyond proc and sysfs; a kernel that lacks one says so in one line
# (5.10, 6.1 and 6.12 have them all) and the tests that need it fail on their own.
for fs in cgroup2:/sys/fs/cgroup bpf:/sys/fs/bpf debugfs:/sys/kernel/debug tracefs:/sys/kernel/tracing; do
    mount -t "${fs%%:*}" "${fs%%:*}" "${fs#*:}" 2> /tmp/mount.err ||
        echo "MATRIX-INFO mount-failed ${fs%%:*} on ${fs#*:}: $(tail -n 1 /tmp/mount.err)"
done
ip link set lo up
# The profiler reads its limits and the hierarchy from the places a host has them.
echo 0 > /proc/sys/kernel/kptr_restrict

# Every command of the suite is cut off after this long: a hang is a failure, not a stuck CI.
LIMIT=180

# stdout is /dev/console, the serial port (console=ttyS0).
say() { echo "$@"; }

# pass NAME DETAIL / fail NAME DETAIL [STDERR-FILE]
pass() { say "MATRIX $1 PASS $2"; }
fail() {
    say "MATRIX $1 FAIL $2"
    if [ -n "$3" ] && [ -s "$3" ]; then
        sed "s/^/MATRIX-LOG $1 /" "$3"
    fi
}

# run NAME CMD...: runs CMD with stderr in /tmp/NAME.err; returns its exit status.
run() {
    name=$1
    shift
    timeout $LIMIT "$@" > "/tmp/$name.out" 2> "/tmp/$name.err"
}

# run_doctor NAME ARGS...: `run` for the doctor, whose exit status is its verdict (0 healthy,
# 3 a warning, 4 an alarm; docs/doctor.md): true when it ran to one.
run_doctor() {
    run "$@"
    case $? in
    0 | 3 | 4) return 0 ;;
    *) return 1 ;;
    esac
}

# The chain every test looks for: fx-chain spends its time in main -> a -> b -> c.
CHAIN='main;a;b;c'
# fx-chain runs until the step that started it kills it (FX_LIFE is only a backstop): with a
# lifetime of 8 s, the profiler's start-up under emulation on a busy host (verifying a 63k-insn
# program, compiling unwind tables) outlasted the fixture and record-* found no fx-chain at all.
FX_LIFE=600

has_chain() { grep -q "$CHAIN" "$1"; }

# The last line of a failed command's stderr: the profiler's one-line error.
why() { tail -n 1 "/tmp/$1.err" | tr -d '\r'; }

say "MATRIX-INFO kernel $(uname -r)"
say "MATRIX-INFO cpus $(nproc)"
# The toolchain that built the eBPF object: the verifier's figures depend on its code.
say "MATRIX-INFO version $(profiler --version)"

# check: every BPF program of the object loaded into this kernel without attaching. Its JSON
# array (one object a line) becomes one line per program, judged on the host (report.rs):
#   MATRIX-INFO verified PROGRAM INSNS|- LOAD_MS loaded|refused: REASON
# INSNS is the verifier's count (verified_insns, Linux 5.16+; null before: -).
json_number() { printf '%s\n' "$2" | sed -n 's/.*"'"$1"'":[[:space:]]*\([0-9.]*\).*/\1/p'; }
json_string() {
    printf '%s\n' "$2" | sed -n 's/.*"'"$1"'":[[:space:]]*"\(\([^"\\]\|\\.\)*\)".*/\1/p' |
        sed 's/\\"/"/g; s/\\\\/\\/g'
}
verified_lines() {
    # Objects split onto lines of their own, should the array come on one line.
    sed 's/}[[:space:]]*,[[:space:]]*{/}\n{/g' "$1" | grep '"program":' | while IFS= read -r obj; do
        program=$(json_string program "$obj")
        insns=$(json_number verified_insns "$obj")
        ms=$(json_number load_ms "$obj")
        if printf '%s\n' "$obj" | grep -q '"loaded":[[:space:]]*true'; then
            state=loaded
        else
            reason=$(json_string refused "$obj")
            state="refused: ${reason:-no reason given}"
        fi
        say "MATRIX-INFO verified ${program:-?} ${insns:--} ${ms:--} $state"
    done
}
run check profiler check --json
status=$?
verified_lines /tmp/check.out
if [ $status = 0 ]; then
    pass check "exit 0, $(grep -c '"program":' /tmp/check.out) programs"
else
    fail check "exit $status: $(why check)" /tmp/check.err
fi

# Whether the kernel lacks bpf_loop (Linux 5.17), as the record's `kernel features` line says;
# without that line, by the kernel's version.
lacks_bpf_loop() {
    if grep -q 'kernel features:' "$1"; then
        grep -q 'kernel features:.*bpf_loop no' "$1"
    else
        set -- $(uname -r | sed 's/^\([0-9]*\)\.\([0-9]*\).*/\1 \2/')
        [ "$1" -lt 5 ] || { [ "$1" = 5 ] && [ "$2" -lt 17 ]; }
    fi
}
# The one line a record whose table walk the kernel refused prints (bpf::variant::lost_lines),
# as a warning: `warning: stacks by frame pointer only: ...`.
FP_ONLY='stacks by frame pointer only:'

# record, once per unwind mode (/matrix/unwind-modes: NAME tables|fp ARGS...). On a kernel
# without bpf_loop the sampler falls back to frame pointers (fx-chain has them, so the chain is
# still found): a table mode must say so in exactly one line, the fp mode must not.
while read -r mode walk args; do
    [ -n "$mode" ] || continue
    t="record-$mode"
    fx-chain $FX_LIFE &
    fx=$!
    if run "$t" profiler -v record -d 3s -F 99 $args -o "/tmp/$t.capture" -o "/tmp/$t.folded"; then
        fp_only=$(grep -cE "^(warning: )?$FP_ONLY" "/tmp/$t.err")
        want=0
        [ "$walk" = tables ] && lacks_bpf_loop "/tmp/$t.err" && want=1
        if ! has_chain "/tmp/$t.folded"; then
            fail "$t" "no $CHAIN in the folded output" "/tmp/$t.folded"
        elif lacks_bpf_loop "/tmp/$t.err" && [ "$fp_only" != "$want" ]; then
            fail "$t" "no bpf_loop, $walk mode: $fp_only lines starting '$FP_ONLY', want $want" "/tmp/$t.err"
        else
            pass "$t" "$(grep -c . "/tmp/$t.folded") stacks, $CHAIN found"
        fi
    else
        fail "$t" "$(why "$t")" "/tmp/$t.err"
    fi
    features=$(grep -o 'kernel features:.*' "/tmp/$t.err" | head -n 1)
    [ -n "$features" ] && say "MATRIX-INFO features ${features#kernel features: }"
    # The one-line warnings a kernel without a feature gets (docs/kernels.md): the log's and
    # the profiler's own (what a refused variant lost, a kernel interface it cannot open).
    grep -e 'WARN' -e '^warning: ' "/tmp/$t.err" | sed 's/^\[WARN *[^]]*\] //; s/^warning: //' |
        while read -r line; do
            say "MATRIX-INFO warning $line"
        done
    kill $fx 2> /dev/null
    wait $fx 2> /dev/null
done < /matrix/unwind-modes

# report: the first mode's capture rendered again.
first=$(sed -n '1s/ .*//p' /matrix/unwind-modes)
if [ -s "/tmp/record-$first.capture" ]; then
    if run report profiler report "/tmp/record-$first.capture" -o /tmp/report.folded; then
        if has_chain /tmp/report.folded; then
            pass report "$CHAIN found in the capture of record-$first"
        else
            fail report "no $CHAIN in the report of record-$first" /tmp/report.folded
        fi
    else
        fail report "$(why report)" /tmp/report.err
    fi
else
    fail report "record-$first wrote no capture"
fi

# runq: the same recording timed every thread's run-queue waits (`--runq on` is the default;
# a kernel that refuses the tracer says so in one warning line and records the rest).
if [ -s "/tmp/record-$first.capture" ]; then
    if grep -q 'run-queue waits are not recorded' "/tmp/record-$first.err"; then
        fail runq "$(grep -m1 'run-queue waits are not recorded' "/tmp/record-$first.err")" "/tmp/record-$first.err"
    elif run runq profiler report "/tmp/record-$first.capture" --stats --runq; then
        waits=$(sed -n 's/^runq_waits: //p' /tmp/runq.out)
        threads=$(sed -n 's/^runq_threads: //p' /tmp/runq.out)
        if [ "${waits:-0}" -gt 0 ] && grep -q 'run-queue waits over' /tmp/runq.out; then
            pass runq "$waits waits of $threads threads"
        else
            fail runq "runq_waits: ${waits:-none}, or no table" /tmp/runq.out
        fi
    else
        fail runq "$(why runq)" /tmp/runq.err
    fi
else
    fail runq "record-$first wrote no capture"
fi

# record --cgroup: fx-chain in a cgroup2 child, sampled through the in-kernel cgroup filter.
mkdir -p /sys/fs/cgroup/matrix
sh -c 'echo $$ > /sys/fs/cgroup/matrix/cgroup.procs && exec fx-chain '$FX_LIFE &
fx=$!
if run record-cgroup profiler record -d 3s -F 99 --cgroup /sys/fs/cgroup/matrix -o /tmp/cgroup.folded; then
    others=$(grep -vc '^fx-chain;' /tmp/cgroup.folded)
    if ! has_chain /tmp/cgroup.folded; then
        fail record-cgroup "no $CHAIN in the folded output" /tmp/cgroup.folded
    elif [ "$others" != 0 ]; then
        fail record-cgroup "$others stacks from outside the cgroup" /tmp/cgroup.folded
    else
        pass record-cgroup "only fx-chain, $CHAIN found"
    fi
else
    fail record-cgroup "$(why record-cgroup)" /tmp/record-cgroup.err
fi
kill $fx 2> /dev/null
wait $fx 2> /dev/null

# doctor, with a process churning cgroups so the churn tracer has something to count.
(
    i=0
    while [ $i -lt 100000 ] && [ ! -e /tmp/churn.stop ]; do
        mkdir /sys/fs/cgroup/churn-$i && rmdir /sys/fs/cgroup/churn-$i
        i=$((i + 1))
        usleep 20000
    done
) &
churner=$!
if run_doctor doctor profiler doctor -d 3s --json; then
    pass doctor "exit 0, $(grep -c . /tmp/doctor.err) report lines"
    # Summed over processes: each busybox mkdir is a process of its own.
    mkdirs=$(grep -o '"mkdirs":[0-9]*' /tmp/doctor.out | sed 's/.*://' | awk '{ n += $1 } END { print n + 0 }')
    if [ "$mkdirs" -gt 0 ]; then
        pass churn "the churn tracer counted $mkdirs cgroup mkdirs"
    else
        fail churn "the churn tracer counted no cgroup mkdir" /tmp/doctor.out
    fi
else
    fail doctor "$(why doctor)" /tmp/doctor.err
    fail churn "doctor failed"
fi
touch /tmp/churn.stop
wait $churner 2> /dev/null

# doctor-v2: dying memory cgroups on cgroup2 (docs/doctor.md). With memory enabled below the
# root, V2_LAB dying memcgs are left under /sys/fs/cgroup/v2lab and V2_OTHER under v2other:
# each child is made, joined by a subshell (writing 0 to cgroup.procs moves the writer) that
# writes a page to tmpfs, and removed; the tmpfs page stays charged to it (no swap here), so
# it stays dying. The doctor must name the dying memcgs on cgroup2 and v2lab as their holder.
V2_LAB=150
V2_OTHER=20
make_dying() {
    i=0
    while [ $i -lt "$2" ]; do
        d="/sys/fs/cgroup/$1/c$i"
        mkdir "$d" || return 1
        ( echo 0 > "$d/cgroup.procs" && echo "page cache of $d" > "/tmp/v2lab/$1-$i" ) || return 1
        rmdir "$d" || return 1
        i=$((i + 1))
    done
}
mkdir -p /tmp/v2lab /sys/fs/cgroup/v2lab /sys/fs/cgroup/v2other
if ! { echo +memory > /sys/fs/cgroup/cgroup.subtree_control &&
    echo +memory > /sys/fs/cgroup/v2lab/cgroup.subtree_control &&
    echo +memory > /sys/fs/cgroup/v2other/cgroup.subtree_control; } 2> /tmp/doctor-v2.err; then
    fail doctor-v2 "cannot enable the memory controller on cgroup2: $(why doctor-v2)" /tmp/doctor-v2.err
elif ! { make_dying v2lab $V2_LAB && make_dying v2other $V2_OTHER; } 2> /tmp/doctor-v2.err; then
    fail doctor-v2 "cannot make dying memory cgroups: $(why doctor-v2)" /tmp/doctor-v2.err
elif
    # A poller like kubelet's: `read` is a shell builtin, so every pass opens and reads
    # memory.stat (the kernel formats all of it on the first read) without a fork.
    ( while :; do read -r line < /sys/fs/cgroup/v2lab/memory.stat; done ) &
    poller=$!
    run_doctor doctor-v2 profiler doctor -d 3s --json
    status=$?
    kill $poller
    wait $poller 2> /dev/null
    [ $status = 0 ]
then
    out=/tmp/doctor-v2.out
    # The poller's entry in "memcg": its share and the functions its stacks were in.
    polled=$(grep -o "{\"pid\":$poller,[^]]*" $out)
    verdict=$(grep -o '"verdict":"[a-z]*"' $out | head -n 1)
    dying=$(grep -o '"v2_memory":{[^{]*"dying":[0-9]*' $out | sed 's/.*://')
    problem=$(grep -o '"[0-9]* dying memory cgroups on cgroup2[^"]*"' $out | head -n 1)
    say "MATRIX-INFO memcg-catalogue $(grep -o '"memcg_functions_present":\[[^]]*\]' $out | sed 's/.*://')"
    if [ "$verdict" = '"verdict":"healthy"' ] || [ -z "$verdict" ]; then
        fail doctor-v2 "verdict ${verdict:-missing} with $V2_LAB + $V2_OTHER dying memcgs made" /tmp/doctor-v2.err
    elif [ "${dying:-0}" -lt $((V2_LAB + V2_OTHER)) ]; then
        fail doctor-v2 "v2_memory counts ${dying:-no} dying memcgs, made $((V2_LAB + V2_OTHER))" /tmp/doctor-v2.err
    elif ! grep -q '"holder":"/sys/fs/cgroup/v2lab"' $out || [ -z "$problem" ] ||
        ! echo "$problem" | grep -q 'under /sys/fs/cgroup/v2lab"'; then
        fail doctor-v2 "the verdict does not name the dying memcgs under /sys/fs/cgroup/v2lab: ${problem:-no problem line}" $out
    elif ! echo "$polled" | grep -q '"function":"memory_stat_show"'; then
        fail doctor-v2 "the memory.stat poller (pid $poller) has no CPU in memory_stat_show: ${polled:-not in memcg}" $out
    else
        share=$(echo "$polled" | grep -o '"percent":[0-9.]*' | sed 's/.*://')
        pass doctor-v2 "$verdict, $problem; the memory.stat poller spent ${share}% of its CPU in memcg code"
    fi
else
    fail doctor-v2 "$(why doctor-v2)" /tmp/doctor-v2.err
fi
rm -rf /tmp/v2lab

# crashloop-v2: two supervisors restart failing programs on cgroup2 (docs/doctor.md). One
# starts each attempt of zagent in a new cgroup, /zsvc/run-N, made by mkdir and removed by
# rmdir; the other re-creates one cgroup, /zsvc-in/agent, for each attempt of zagent-in. The
# child moves itself (writing 0 to cgroup.procs moves the writer) and execs the program, a
# script that exits with status 2. Each supervisor logs its starts (uptime, by the `read`
# builtin). The doctor must find both loops, by place, with their status and a restart rate
# within 10% of the supervisor's own over the same time, and raise them as problems.
printf '#!/bin/sh\nexit 2\n' > /bin/zagent
cp /bin/zagent /bin/zagent-in
chmod +x /bin/zagent /bin/zagent-in
supervise() { # supervise PROGRAM CGROUP-OF-ATTEMPT-N (N in the name as @) LOG
    i=0
    while [ ! -e /tmp/zsvc.stop ]; do
        d=$(echo "$2" | sed "s/@/$i/")
        read -r up _ < /proc/uptime
        echo "$up" >> "$3"
        mkdir -p "$d" && sh -c "echo 0 > $d/cgroup.procs && exec $1"
        rmdir "$d"
        i=$((i + 1))
        usleep 100000
    done
}
# rate_within LOG FROM TO DOCTOR-RATE: whether the log's starts a minute between FROM and TO
# (uptime s) are within 10% of the doctor's; prints both.
rate_within() {
    awk -v from="$2" -v to="$3" -v doctor="$4" '
        $1 >= from && $1 <= to { if (n == 0) first = $1; last = $1; n++ }
        END {
            logged = (n > 1 && last > first) ? (n - 1) * 60 / (last - first) : 0
            printf "doctor %s/min, the supervisor %.0f/min", doctor, logged
            d = doctor - logged; if (d < 0) d = -d
            exit !(logged > 0 && d <= logged * 0.10)
        }' "$1"
}
supervise /bin/zagent /sys/fs/cgroup/zsvc/run-@ /tmp/zsvc-new.log &
per_attempt=$!
supervise /bin/zagent-in /sys/fs/cgroup/zsvc-in/agent /tmp/zsvc-same.log &
in_place=$!
read -r from _ < /proc/uptime
run crashloop-v2 profiler doctor -d 5s --json
status=$?
if [ $status = 0 ] || [ $status = 3 ]; then
    fail crashloop-v2 "exit status $status, not 4 (an alarm)" /tmp/crashloop-v2.err
elif [ $status = 4 ]; then
    read -r to _ < /proc/uptime
    out=/tmp/crashloop-v2.out
    # The name is `zagent (/bin/busybox)`: the script's interpreter is busybox's sh.
    new=$(grep -o '"crash loop: zagent [^"]*in cgroup /zsvc/run-\* (a new one each time: [0-9]* cgroups) exited with code 2[^"]*"' $out | head -n 1)
    same=$(grep -o '"crash loop: zagent-in [^"]*in cgroup /zsvc-in/agent exited with code 2[^"]*"' $out | head -n 1)
    per_min() { echo "$1" | sed 's/.* times in [0-9.]* s (\([0-9]*\)\/min.*/\1/'; }
    if [ -z "$new" ] || [ -z "$same" ]; then
        fail crashloop-v2 "the doctor did not raise both crash loops (new: ${new:-none}; in place: ${same:-none})" /tmp/crashloop-v2.err
    elif ! rates_new=$(rate_within /tmp/zsvc-new.log "$from" "$to" "$(per_min "$new")") ||
        ! rates_same=$(rate_within /tmp/zsvc-same.log "$from" "$to" "$(per_min "$same")"); then
        fail crashloop-v2 "restart rates off by more than 10%: new cgroups: $rates_new; in place: ${rates_same:-?}" /tmp/crashloop-v2.err
    else
        pass crashloop-v2 "$(echo "$new" | cut -c1-120) ($rates_new); $(echo "$same" | cut -c1-80) ($rates_same)"
    fi
else
    fail crashloop-v2 "$(why crashloop-v2)" /tmp/crashloop-v2.err
fi
touch /tmp/zsvc.stop
wait $per_attempt $in_place 2> /dev/null

# agent: one window stored, then read back with query.
fx-chain $FX_LIFE &
fx=$!
profiler agent -F 99 --window 2s --data-dir /tmp/agent --listen 127.0.0.1:7070 2> /tmp/agent.err &
agent=$!
up=no
for _ in $(seq 1 120); do
    if wget -q -O /dev/null http://127.0.0.1:7070/healthz 2> /dev/null; then
        up=yes
        break
    fi
    kill -0 $agent 2> /dev/null || break
    sleep 1
done
if [ $up = yes ]; then
    # Two windows' time plus slack, so at least one window is closed and stored.
    sleep 6
    kill -TERM $agent
    wait $agent
    if run query profiler query --data-dir /tmp/agent --since 10m -o /tmp/query.folded; then
        if has_chain /tmp/query.folded; then
            pass agent "a window stored, query found $CHAIN"
        else
            fail agent "query found no $CHAIN" /tmp/query.folded
        fi
    else
        fail agent "query: $(why query)" /tmp/query.err
    fi
else
    kill $agent 2> /dev/null
    wait $agent 2> /dev/null
    fail agent "the agent never answered /healthz" /tmp/agent.err
fi
kill $fx 2> /dev/null
wait $fx 2> /dev/null

# The deliberately broken sampler (feature matrix-broken): every kernel must reject it, and
# the matrix checks that the verifier's complaint reaches the report.
if [ -x /bin/profiler-broken ]; then
    if run broken profiler-broken -v record -d 1s -o /tmp/broken.folded; then
        pass broken "loaded, though it must not"
    else
        fail broken "$(why broken)" /tmp/broken.err
    fi
fi

say MATRIX-END
sync
poweroff -f
