#!/usr/bin/env bash
# The robot path on a real ROS 2, as a user takes it: frt_msgs and frt_robot_host built by
# colcon (ament_cmake + ament_cargo) in a workspace over a ROS 2 Jazzy install, started with
# `ros2 launch frt_robot_host robot_host.launch.py` on a tiny model, once per transport
# (`transport:=rcl`, then `transport:=dds`), and exercised by an rclpy peer
# (scripts/ros2_peer.py) and by the ROS 2 command line. Exits non-zero on any failure.
#
#   ROS2_SETUP=/opt/ros/jazzy/setup.bash scripts/ros2-integration.sh
#
# Environment:
#   ROS2_SETUP     the ROS 2 install's setup.bash (default /opt/ros/jazzy/setup.bash)
#   FRT_ROS2_WS    the colcon workspace to build in (default target/ros2-ws)
#   TRANSPORTS     which transports to run (default "rcl dds")
#   SKIP_BUILD=1   reuse the workspace's last build
#   CARGO_PROFILE  --release (default) or "" for a debug build
# Needs, besides ROS 2 Jazzy (rclpy, ros2cli, launch_ros, rmw_cyclonedds_cpp, common_interfaces):
# colcon with colcon-cargo and colcon-ros-cargo, cargo-ament-build, libclang (r2r's bindgen).
# What each command printed is kept in $FRT_ROS2_WS/transcript-<transport>.txt.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
ros2_setup=${ROS2_SETUP:-/opt/ros/jazzy/setup.bash}
ws=${FRT_ROS2_WS:-$repo/target/ros2-ws}
transports=${TRANSPORTS:-rcl dds}
profile=${CARGO_PROFILE---release}
node=/frt_robot_host
passed=0
failed=0

die() { echo "ros2-integration: $*" >&2; exit 2; }
ok() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }

[ -f "$ros2_setup" ] || die "no ROS 2 setup file at $ros2_setup (set ROS2_SETUP)"
# ROS 2's setup scripts read unset variables.
set +u
# shellcheck disable=SC1090
source "$ros2_setup" || die "sourcing $ros2_setup failed"
set -u
[ "${ROS_DISTRO:-}" = jazzy ] || echo "note: ROS_DISTRO is '${ROS_DISTRO:-}', the project targets jazzy"
command -v colcon > /dev/null || die "colcon is not installed"
command -v ros2 > /dev/null || die "ros2 (ros2cli) is not on the PATH after $ros2_setup"
cargo ament-build --help > /dev/null 2>&1 || die "cargo-ament-build is missing: cargo install --locked cargo-ament-build"
python3 -c "import colcon_ros_cargo" 2> /dev/null ||
    die "colcon-ros-cargo is missing: pip install colcon-cargo colcon-ros-cargo"

mkdir -p "$ws"
cd "$ws" || die "cannot enter $ws"

# --- build -------------------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    start=$(date +%s)
    # shellcheck disable=SC2086
    if ! colcon build --base-paths "$repo/msgs" "$repo/robot_host" \
        --packages-select frt_msgs frt_robot_host \
        --event-handlers console_cohesion+ \
        --cargo-args $profile --features ros2,dds,ros2-set-subgoal > build.log 2>&1; then
        tail -60 build.log
        die "colcon build failed (all of it in $ws/build.log)"
    fi
    echo "colcon build: $(( $(date +%s) - start )) s"
fi
set +u
# shellcheck disable=SC1091
source "$ws/install/setup.bash" || die "sourcing the workspace failed"
set -u

share=$(ros2 pkg prefix frt_robot_host 2> /dev/null)/share/frt_robot_host
for f in package.xml launch/robot_host.launch.py config/pi05_thor.yaml config/demo.yaml; do
    if [ -f "$share/$f" ]; then ok "installed share/frt_robot_host/$f"; else fail "not installed: $share/$f"; fi
done
if ros2 pkg executables frt_robot_host | grep -q "frt_robot_host frt-robot-host"; then
    ok "ros2 pkg executables lists frt-robot-host"
else
    fail "ros2 pkg executables frt_robot_host: $(ros2 pkg executables frt_robot_host 2>&1)"
fi
if ros2 interface show frt_msgs/srv/SetSubgoal | grep -q "uint64 subgoal_id"; then
    ok "frt_msgs/srv/SetSubgoal is installed"
else
    fail "ros2 interface show frt_msgs/srv/SetSubgoal"
fi

# --- the configuration: the demo's tiny model, no microphone, a JointTrajectory output ----
cfg=$ws/integration.yaml
sed -e '/^audio:/,$d' "$repo/config/demo.yaml" > "$cfg"
# 2 Hz: the tiny model on the host backend ticks in about 0.3 s on a 2-core machine beside the
# peer and the command line (5 Hz, the demo's rate, misses its deadlines there).
sed -i -e 's/^  rate_hz: .*/  rate_hz: 2/' "$cfg"
grep -q '^  rate_hz: 2$' "$cfg" || die "the demo configuration has no control.rate_hz to set"
cat >> "$cfg" << 'EOF'
ros:
  frame_id: base_link
  joint_trajectory:
    topic: /joint_trajectory
    joints: [joint1, joint2, joint3, joint4, joint5, joint6, gripper]
EOF
# The tiny model's tokenizer and assets are found from the source tree.
if exe=$(ros2 pkg prefix frt_robot_host)/lib/frt_robot_host/frt-robot-host && "$exe" check --config "$cfg" > check.log 2>&1; then
    ok "frt-robot-host check --config integration.yaml"
else
    cat check.log
    die "the integration configuration does not check"
fi

# Each run stays on this host, in a domain of its own.
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export ROS_DOMAIN_ID=$(( 40 + RANDOM % 50 ))
export RMW_IMPLEMENTATION=${RMW_IMPLEMENTATION:-rmw_cyclonedds_cpp}
peer=$repo/scripts/ros2_peer.py

# `expect NAME PATTERN CMD...`: runs CMD (20 s at most), keeps its output in the transcript,
# and checks that it matches the extended regular expression PATTERN.
expect() {
    local name=$1 pattern=$2 out
    shift 2
    out=$(timeout 20 "$@" 2>&1)
    { echo "\$ $*"; echo "$out"; echo; } >> "$transcript"
    if grep -Eq -- "$pattern" <<< "$out"; then ok "$name"; else fail "$name: /$pattern/ not in: $(head -c 600 <<< "$out")"; fi
}
# `expect_not NAME PATTERN CMD...`: the same, checking that PATTERN does not match.
expect_not() {
    local name=$1 pattern=$2 out
    shift 2
    out=$(timeout 20 "$@" 2>&1)
    { echo "\$ $*"; echo "$out"; echo; } >> "$transcript"
    if grep -Eq -- "$pattern" <<< "$out"; then fail "$name: /$pattern/ in: $(head -c 600 <<< "$out")"; else ok "$name"; fi
}

for transport in $transports; do
    echo "== transport:=$transport (ROS_DOMAIN_ID=$ROS_DOMAIN_ID, $RMW_IMPLEMENTATION)"
    transcript=$ws/transcript-$transport.txt
    : > "$transcript"
    ros2 daemon stop > /dev/null 2>&1
    log=$ws/launch-$transport.log
    setsid ros2 launch frt_robot_host robot_host.launch.py config:="$cfg" transport:="$transport" \
        > "$log" 2>&1 &
    launch=$!
    for _ in $(seq 120); do
        grep -q '"ready"\|ready' "$log" 2> /dev/null && break
        kill -0 $launch 2> /dev/null || break
        sleep 0.5
    done
    if grep -q 'ready' "$log"; then
        ok "[$transport] ros2 launch: the node is ready"
    else
        cat "$log"
        fail "[$transport] ros2 launch: the node did not become ready"
        kill -INT -- -$launch 2> /dev/null
        wait $launch
        continue
    fi

    # The rclpy peer's checks (topics, the service, interrupt and resume, refused frames).
    if timeout 150 python3 "$peer" --node $node --checks > "$ws/peer-$transport.log" 2>&1; then
        ok "[$transport] rclpy peer: $(tail -1 "$ws/peer-$transport.log")"
    else
        fail "[$transport] rclpy peer:"
    fi
    sed 's/^/    /' "$ws/peer-$transport.log"

    # The command line, while the peer feeds the sensors.
    python3 "$peer" --node $node --feed 120 > /dev/null 2>&1 &
    feeder=$!
    sleep 2
    expect "[$transport] ros2 node list" "^$node\$" ros2 node list --no-daemon
    info=(ros2 node info $node --no-daemon)
    expect "[$transport] node info: camera subscriptions" "/camera/base/image_raw: sensor_msgs/msg/Image" "${info[@]}"
    expect "[$transport] node info: compressed camera" "/camera/wrist/image_raw/compressed: sensor_msgs/msg/CompressedImage" "${info[@]}"
    expect "[$transport] node info: joint states" "/joint_states: sensor_msgs/msg/JointState" "${info[@]}"
    expect "[$transport] node info: command topics" "$node/interrupt: std_msgs/msg/Empty" "${info[@]}"
    expect "[$transport] node info: action chunks" "$node/action_chunk: frt_msgs/msg/ActionChunk" "${info[@]}"
    expect "[$transport] node info: trajectory" "/joint_trajectory: trajectory_msgs/msg/JointTrajectory" "${info[@]}"
    expect "[$transport] node info: diagnostics" "/diagnostics: diagnostic_msgs/msg/DiagnosticArray" "${info[@]}"
    expect "[$transport] node info: rosout" "/rosout: rcl_interfaces/msg/Log" "${info[@]}"
    expect "[$transport] node info: set_subgoal" "$node/set_subgoal: frt_msgs/srv/SetSubgoal" "${info[@]}"
    expect "[$transport] node info: parameter services" "$node/set_parameters: rcl_interfaces/srv/SetParameters" "${info[@]}"
    expect "[$transport] topic list -t" "$node/action_chunk \[frt_msgs/msg/ActionChunk\]" ros2 topic list -t --no-daemon
    expect "[$transport] topic echo --once action_chunk" "action_dim: 7" ros2 topic echo --once $node/action_chunk
    expect "[$transport] topic hz action_chunk (2 Hz)" "average rate: (1\.[89]|2\.[01])" \
        timeout -s INT 12 ros2 topic hz $node/action_chunk
    expect "[$transport] topic echo --once status" "halted: false" ros2 topic echo --once $node/status
    expect "[$transport] service call set_subgoal" "accepted=True" \
        ros2 service call $node/set_subgoal frt_msgs/srv/SetSubgoal "{subgoal: 'open the drawer'}"
    expect "[$transport] the chunks take it" "subgoal: open the drawer" \
        ros2 topic echo --once $node/action_chunk
    expect "[$transport] param list" "safety.action_max" ros2 param list $node
    expect "[$transport] param get control.rate_hz" "Double value is: 2.0" ros2 param get $node control.rate_hz
    expect "[$transport] param set a live field" "Set parameter successful" \
        ros2 param set $node safety.max_observation_age_ms 300
    expect "[$transport] param get reads it back" "Integer value is: 300|Double value is: 300" \
        ros2 param get $node safety.max_observation_age_ms
    expect "[$transport] param set a read-only field is refused" "Setting parameter failed" \
        ros2 param set $node control.rate_hz 10.0
    expect "[$transport] topic pub interrupt" "publishing" \
        ros2 topic pub --once $node/interrupt std_msgs/msg/Empty
    expect "[$transport] halted after the interrupt" "halted: true" ros2 topic echo --once $node/status
    expect "[$transport] topic pub resume" "publishing" ros2 topic pub --once $node/resume std_msgs/msg/Empty
    sleep 1
    expect "[$transport] moving after resume" "halted: false" ros2 topic echo --once $node/status
    if [ "$transport" = dds ]; then
        expect "[$transport] lifecycle nodes" "^$node\$" ros2 lifecycle nodes
        expect "[$transport] lifecycle get: active" "active \[3\]" ros2 lifecycle get $node
        expect "[$transport] lifecycle set deactivate" "Transitioning successful" \
            ros2 lifecycle set $node deactivate
        expect "[$transport] inactive: halted" "halted: true" ros2 topic echo --once $node/status
        expect "[$transport] lifecycle set activate" "Transitioning successful" \
            ros2 lifecycle set $node activate
        sleep 1
        expect "[$transport] active: moving again" "halted: false" ros2 topic echo --once $node/status
    else
        # The rcl transport is not a managed node (README): it must not pretend to be one.
        expect_not "[$transport] not listed as a lifecycle node" "^$node\$" ros2 lifecycle nodes
    fi
    kill $feeder 2> /dev/null
    wait $feeder 2> /dev/null

    # Interrupted as a user stops it: Ctrl-C to ros2 launch.
    kill -INT -- -$launch 2> /dev/null
    for _ in $(seq 60); do kill -0 $launch 2> /dev/null || break; sleep 0.25; done
    if kill -0 $launch 2> /dev/null; then
        fail "[$transport] ros2 launch still running 15 s after SIGINT"
        kill -KILL -- -$launch 2> /dev/null
    fi
    wait $launch
    if grep -Eq "process has finished cleanly|exit code 0" "$log"; then
        ok "[$transport] the node exits cleanly on SIGINT"
    else
        fail "[$transport] exit on SIGINT: $(grep -E 'process has died|exit code' "$log")"
    fi
    if pgrep -f "lib/frt_robot_host/frt-robot-host" > /dev/null; then
        fail "[$transport] a frt-robot-host process is left running"
        pkill -KILL -f "lib/frt_robot_host/frt-robot-host"
    fi
    { echo "--- ros2 launch output"; cat "$log"; } >> "$transcript"
done

ros2 daemon stop > /dev/null 2>&1
echo "ros2-integration: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
