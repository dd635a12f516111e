# Facts: X4, X5, G6, G7, G8
# Run: bash examples/select_devices.sh   (inside the workspace venv: uv run bash examples/select_devices.sh)
#
# Choose which Intel GPUs / Gaudis one run may use, for that one command only. Everything here
# works on a machine without those devices: --kind names the accelerator of the machine that runs
# the command. Nothing is exported into this shell.
set -euo pipefail

echo "== X4: ZE_AFFINITY_MASK on the same command line, never exported"
# The seed's line is `ZE_AFFINITY_MASK=0,2 torchrun trainer-program.py`; hwenv exec sets the
# variables for the one command it runs (os.execvpe, no shell), here `printenv` to show them:
echo "the child sees ZE_AFFINITY_MASK and ZE_ENABLE_PCI_ID_DEVICE_ORDER:"
hwenv exec --kind xpu --devices 0,2 -- printenv ZE_AFFINITY_MASK ZE_ENABLE_PCI_ID_DEVICE_ORDER
echo "after the command, this shell has ZE_AFFINITY_MASK=${ZE_AFFINITY_MASK:-<unset>}"
echo "real run: hwenv exec --kind xpu --devices 0,2 -- torchrun --nproc-per-node 2 trainer-program.py"

echo "== X5: the mask's order does not set the enumeration order; PCI order does"
hwenv env --kind xpu --devices 2,0
echo "(PyTorch still sees devices 0 and 2 in driver order; ZE_ENABLE_PCI_ID_DEVICE_ORDER=1 makes it lowest PCI bus id first, every run)"

echo "== G6: Gaudi modules for a container (module IDs survive reboots; indices can change)"
echo "docker run --runtime=habana $(hwenv env --kind hpu --devices 0,1,2,3 --format docker) IMAGE python train.py"

echo "== G7: device indices -> module IDs through hl-smi -Q index,module_id -f csv"
if command -v hl-smi > /dev/null; then
    hl-smi -Q index,module_id -f csv
    echo "indices 0,1 are these modules:"
    hwenv env --kind hpu --by index --devices 0,1
else
    echo "hl-smi is not on PATH (no Gaudi software here), so indices cannot be mapped; pass module IDs instead"
fi

echo "== G8: on part of a server, only Intel's 2- and 4-device module groups"
hwenv env --kind hpu --devices 5,4,7,6
if refusal=$(hwenv env --kind hpu --devices 0,2 2>&1); then
    echo "unexpected: module IDs 0,2 were accepted: $refusal"
    exit 1
fi
echo "refused 0,2: $refusal"
