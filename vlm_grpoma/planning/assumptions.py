"""The assumptions of ``vlm-grpoma plan``'s memory formulas, as text for ``--help`` and the README.

Kept free of heavy imports so the CLI can print them instantly; :mod:`~vlm_grpoma.planning.memory` implements
exactly what this text says.
"""

ASSUMPTIONS = """\
Sizes: P parameters held in training (base + adapters + trainable copies), T trainable, F = P - T
frozen, N data-parallel ranks (GPUs x nodes), w bytes per weight (2 for bf16/fp16, 4 for fp32).

1. Model states (weights, gradients, optimizer). Mixed precision (bf16/fp16), AdamW with fp32 master
   weights: ZeRO-2 and ZeRO-3 use DeepSpeed's own estimators on the trainable parameters
   (estimate_zero2_model_states_mem_needs: 2T + 18T/N, or 2T with offload_optimizer;
   estimate_zero3_model_states_mem_needs: 4*largest_layer + 18T/N, or + 2T/N with offload);
   ZeRO-1 4T + 16T/N and ZeRO-0 (DeepSpeed's BF16 optimizer) 8T + 12T/N, which DeepSpeed does not
   estimate. fp32 (CPU runs): weights 4P, gradients 4T (4T/N from ZeRO-2), AdamW moments 8T
   (8T/N from ZeRO-1) plus DeepSpeed's fp32 partition copy 4T/N at ZeRO-1/2. Frozen weights take
   wF (wF/N at ZeRO-3); a full-fine-tuning reference model for the KL term another wP (/N at
   ZeRO-3). Communication buckets: the ZeRO JSON's reduce/all-gather (or prefetch) bucket sizes, w each.
2. Training pass (one micro-batch of train.micro_batch_prompts prompts, or with train.micro_batch_tokens
   as many rows at the budget maxima as the budget holds, at least one). The shared-prefix pass packs one
   row per prompt: prompt + K*thought + K*M*answer tokens at the budget maxima; the naive pass has K*M
   rows of prompt + thought + answer. With rollout.adaptive_answers on, K*M here and below is its budget
   (the answers a prompt trains on; each of its two sampling phases holds at most that many). A prompt is max_pixels / factor^2 image tokens plus 200 text
   tokens (full prompt style; 70 compact), measured with the real Qwen2 tokenizer with a 15-word referring
   expression and rounded up. Saved activations per token and decoder layer (autograd keeps only what the
   backward needs, so frozen linear layers keep no inputs): (8 + 2w)h for the two RMSNorms (fp32 inside),
   w(h + kv) for the rotated queries and keys, 2wh for keys and values repeated to all heads, wh
   for the attention output, 4wI for the SwiGLU MLP (h hidden, kv key/value width, I MLP
   width); LoRA dropout adds (w + 1)(6h + I) (a dropped-out copy and its mask per adapted input). Gradient
   checkpointing keeps only each layer's input (wh) plus one layer's activations during its recompute.
   Attention is assumed to run in a fused SDPA kernel (no L x L scores; on GPUs the memory-efficient
   kernel takes the packed pass's mask), plus the mask itself ((w + 4) L^2 per row; with
   model.attn_implementation flex_attention a BlockMask: 16 (L/128)(L/128 + 1) + 17L bytes per row).
   Logits of the scored columns (the completion + 1): V(w + 8) bytes each (output, fp32 copy, gradient;
   8V in fp32).
   A frozen vision tower keeps nothing for the backward; a trained one keeps w(6h_v + 3I_v) per patch and
   layer. The vision forward's transient peak is not counted (it is smaller than one decoder layer's).
3. Rollout. rollout.backend: hf keeps a KV cache of prompts per rank x K x M rows of prompt +
   thought + answer tokens (the prompt+thought cache is copied M times), 2 * layers * kv * w bytes per
   token, plus fp32 next-token logits per row. Under ZeRO-3 the full weights (wP) are gathered while
   sampling and for the vLLM weight sync after each step. Rollout and the training pass never overlap: the
   peak takes the larger. rollout.backend: vllm reserves rollout.vllm.gpu_memory_utilization of the GPU
   for vLLM (its weight copy, 2P/tensor_parallel, and its KV cache); training gets the rest.
4. Reserve: 1 GiB for the CUDA context, cuBLAS workspaces and NCCL buffers, and 10 % of the activation and
   KV-cache peak for allocator fragmentation (none on CPU). GB means 2^30 bytes, as nvidia-smi reports.
5. Checkpoint size: model/ holds the adapter and trainable copies (LoRA) or the whole model, w bytes per
   parameter; deepspeed/ the trainable weights (w each; ZeRO-3 keeps them in its partitions) plus fp32
   master weights and two AdamW moments (12 bytes; 8 for fp32 at ZeRO-0). Frozen parameters are not saved.

Not modelled: other processes on the GPU, activation offloading, sequence packing across prompts, CPU RAM
beyond DeepSpeed's own offload estimate, and vLLM's internal activation memory beyond its reserved share.
"""
