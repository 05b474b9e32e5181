# Sourced by the GPU machine scripts (bench/streaming_device.sh, bench/cuda/decode_device.sh),
# from the repository root: where the build, the synthetic models and the generator live, and
# run(), which prints a command before running it.
#   NT_BUILD_DIR (build-gpu), MODELS (models/synth), SYNTH (../shared/tools/synth_gguf.py)
build=${NT_BUILD_DIR:-build-gpu}
models=${MODELS:-models/synth}
synth=${SYNTH:-../shared/tools/synth_gguf.py}
nt="$build/ntransformer"
m70="$models/llama-70b-q4_k_m.gguf"  # synthetic Llama-3 70B Q4_K_M, 42.5 GB

# synth_model FILE SHAPE FTYPE: the synthetic model (8b or 70b shape) unless FILE exists, written
# under another name first so that an interrupted write never passes for a model.
synth_model() {
    [ -f "$1" ] || { python3 "$synth" "$1.tmp" --shape "$2" --ftype "$3" --repeat-layers && mv "$1.tmp" "$1"; }
}

run() {
    echo "+ $*"
    "$@"
}
