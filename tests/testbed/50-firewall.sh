#!/usr/bin/env bash
# Picked up by up.sh: what the firewall tests need (tests/it/firewall/). nft loads and lists
# rules; ip makes the network namespaces each test runs the agent in, joined by veth pairs; ping checks
# that ICMP echo is let in.
# Nothing here loads a rule into the machine's own namespace.
set -euo pipefail
need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
# ufw, found on adopted nodes; the tests run it in their namespaces with a private /etc/ufw.
command -v ufw >/dev/null || need+=(ufw)
# iptables-legacy: a filter made with it (not seen by nft) must refuse an adopted node's
# declaration; the tests make one in their namespaces.
command -v iptables-legacy >/dev/null || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
nft --version
