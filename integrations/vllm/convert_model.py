"""Convert a GGUF model to an HF directory that vLLM's CPU backend can load (vLLM's CPU
backend reads no GGUF): transformers dequantizes the GGUF weights to float32.

usage: python convert_model.py MODEL.gguf OUT_DIR
"""
import os
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    if os.path.exists(os.path.join(out, "config.json")):
        print(f"convert_model: {out} exists")
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.split(os.path.abspath(src))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # the weights are dequantized float32 now, but the model still carries the GGUF
    # quantizer, which save_pretrained refuses: drop it
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if attr in vars(model):
            delattr(model, attr)
    tmp = out + ".tmp"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    print(f"convert_model: wrote {out}")


if __name__ == "__main__":
    main()
