#!/bin/sh
# Runs `step35 eval --ep` as two "hosts": two network namespaces joined by a veth pair,
# one rank in each, OpenMPI talking TCP over the veth link only (the way two machines on
# a LAN would). mpirun starts in the first namespace and reaches the second through an
# rsh agent that enters that namespace instead of using ssh.
# usage: ep_two_hosts.sh STEP35 MODEL EVAL-ARGS...   (stdout: rank 0's output)
# exit 77: namespaces (or veth) not permitted here.
set -u
bin=$1
shift
id=$$
a=s35a$id b=s35b$id
dir=$(mktemp -d)
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null; then
  echo "network namespaces are not permitted here (ip netns add failed)" >&2
  exit 77
fi
if ! ip link add "va$id" type veth peer name "vb$id" 2>/dev/null; then
  echo "veth pairs are not permitted here (ip link add ... type veth failed)" >&2
  exit 77
fi
ip link set "va$id" netns "$a" && ip link set "vb$id" netns "$b" &&
  ip -n "$a" addr add 10.251.0.1/24 dev "va$id" && ip -n "$b" addr add 10.251.0.2/24 dev "vb$id" &&
  ip -n "$a" link set "va$id" up && ip -n "$b" link set "vb$id" up &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up || { echo "cannot configure the veth pair" >&2; exit 1; }

# mpirun calls the agent as: AGENT HOST COMMAND...
cat > "$dir/agent" <<AGENT
#!/bin/sh
host=\$1
shift
case \$host in
  10.251.0.1) ns=$a ;;
  10.251.0.2) ns=$b ;;
  *) echo "unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$dir/agent"

ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  timeout 300 ip netns exec "$a" mpirun -np 2 --host 10.251.0.1:1,10.251.0.2:1 \
  --mca plm_rsh_agent "$dir/agent" --mca btl tcp,self \
  --mca btl_tcp_if_include 10.251.0.0/24 --mca oob_tcp_if_include 10.251.0.0/24 \
  --mca mpi_yield_when_idle 1 -x ASAN_OPTIONS \
  "$bin" "$@" --ep
