// Added to kube-network-policies by sandboxrun's e2e/cluster/build.sh (not upstream code).
//
// Upstream queues packets with nftables' native `queue` expression, which needs the kernel's
// nft_queue (CONFIG_NFT_QUEUE). Kernels built without it refuse the whole rule set, and then no
// NetworkPolicy is enforced at all. This returns the xtables NFQUEUE target instead, run by
// nft_compat (what `iptables -j NFQUEUE` uses): the same packets reach the same queue, where
// upstream's verdict logic is unchanged.

package networkpolicy

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// xtQueue: NFQUEUE revision 3 (struct xt_NFQ_info_v3: queuenum, queues_total, flags, each a
// native-endian u16, padded to the 8-byte xtables alignment). Flag 1 is NFQ_FLAG_BYPASS: accept
// instead of drop when no program listens on the queue (upstream's --fail-open).
func xtQueue(num uint16, bypass bool) expr.Any {
	info := make([]byte, 8)
	binary.NativeEndian.PutUint16(info[0:], num)
	binary.NativeEndian.PutUint16(info[2:], 1)
	if bypass {
		binary.NativeEndian.PutUint16(info[4:], 1)
	}
	raw := xt.Unknown(info)
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &raw}
}
