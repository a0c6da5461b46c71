# A large synthetic host for tests/bench/discovery_bench: 1,088 PCI functions, 64 GPUs.
#
# Not a real machine: a scaled-up composite of the HGX H100 nodes in tests/fixtures/hosts (four
# PCI domains as on a multi-segment server, each with 16 root ports; behind each a Broadcom
# PEX89104 switch with three downstream ports carrying an H100 SXM5, a ConnectX-7 with 8 SR-IOV
# virtual functions per port and a Samsung PM1733 NVMe). Every function has its own IOMMU group.
# 64 complexes x 17 functions = 1,088 functions; 64 single-GPU vfio-group units.
from mkhost import CX7, H100_SXM5, INTEL_SPR_RP, NVME_PM1733, PEX89104, bdf, dev, unit

MODELS = "synthetic: 64 HGX-style GPU complexes over 4 PCI domains (benchmark host, not a real machine)"

devices, expect = [], []
group = 0


def next_group():
    global group
    group += 1
    return group


for i in range(64):
    dom, k = divmod(i, 16)
    numa = dom // 2
    b = 0x10 + 0x0c * k
    rp = bdf(0x00, k + 1, 0, dom)
    up, dn = bdf(b, 0, 0, dom), [bdf(b + 1, s, 0, dom) for s in range(3)]
    gpu, nic0, nic1, nvme = bdf(b + 2, 0, 0, dom), bdf(b + 3, 0, 0, dom), bdf(b + 3, 0, 1, dom), bdf(b + 4, 0, 0, dom)
    devices += [dev(rp, INTEL_SPR_RP, driver="pcieport", group=next_group(), numa=numa),
                dev(up, PEX89104, driver="pcieport", group=next_group(), parent=rp, numa=numa)]
    devices += [dev(d, PEX89104, driver="pcieport", group=next_group(), parent=up, numa=numa) for d in dn]
    g = next_group()
    devices.append(dev(gpu, H100_SXM5, driver="vfio-pci", group=g, parent=dn[0], numa=numa))
    expect.append(unit("u-" + gpu.replace(":", "-").replace(".", "-"), g, "vfio-group", [numa],
                       [(gpu, "gpu", "vfio-pci")]))
    for pf in (nic0, nic1):
        devices.append(dev(pf, CX7, driver="mlx5_core", group=next_group(), parent=dn[1], numa=numa,
                           sriov=(8, 4), multifunction=1))
    for pf, first in ((nic0, 4), (nic1, 8)):  # ARI routing: VFs at functions 00.4-00.7 and 01.0-01.3
        devices += [dev(bdf(b + 3, (first + v) >> 3, (first + v) & 7, dom), CX7, driver="mlx5_core",
                        group=next_group(), parent=dn[1], numa=numa, physfn=pf) for v in range(4)]
    devices.append(dev(nvme, NVME_PM1733, driver="nvme", group=next_group(), parent=dn[2], numa=numa))

HOST = {"cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 ro intel_iommu=on iommu=pt", "devices": devices}
EXPECT = sorted(expect, key=lambda u: u["id"])
