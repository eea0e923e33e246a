# probe.py for containers without Python (the frontend's image: Debian minbase, bash and
# coreutils): bash's /dev/tcp and /dev/udp instead of sockets. Run as
#   bash -c "$(cat probe.sh)" probe NAME PROTO IP PORT MODE [NAME PROTO IP PORT MODE ...]
# and prints what probe.py prints: one JSON line per target, in the order they finish.
# MODE "pong": reached only when the listener answered; "connect": a TCP connection is enough
# (the API server, which does not answer "pong").
set -u
one() { # name proto ip port mode
  local answer rc
  answer=$(timeout 3 bash -c '
    exec 3<>"/dev/$1/$2/$3" || exit 9
    [[ $4 == connect ]] && { echo connected; exit 0; }
    printf "ping\n" >&3
    # One read(2) of the whole answer: bash'"'"'s read takes a byte at a time, which on a UDP
    # socket would drop the rest of the datagram with the first byte.
    timeout 2 dd bs=64 count=1 status=none <&3' _ "$2" "$3" "$4" "$5" 2>&1)
  rc=$?
  answer=${answer//[\"\\]/}
  answer=${answer//$'\n'/ }
  local reached=false
  [[ $rc == 0 && ( $answer == pong* || $answer == connected ) ]] && reached=true
  # One write per line, so lines of targets probed side by side do not interleave.
  printf '{"name": "%s", "reached": %s, "detail": "exit %s: %s"}\n' "$1" "$reached" "$rc" "$answer"
}
while (($# >= 5)); do
  one "$1" "$2" "$3" "$4" "$5" &
  shift 5
done
wait
