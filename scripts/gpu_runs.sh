#!/bin/bash
# Named side-by-side runs (`python -m sgl_sidp.bench.compare`) for one device call on a lent GPU host, each stopped
# before the call's end and resumable: a run folder carried back in .gpu/prev/NAME is copied into $OUT/NAME first,
# and compare skips what it holds. Every folder under $OUT is also packed as $OUT/NAME.tgz (a call returns few files).
# Usage (GPU host, repo root; carry .whl, .gpu/models, .gpu/traces and .gpu/prev):
#   SIDP_COMMIT=COMMIT TOTAL=570 OUT=/some/dir bash scripts/gpu_runs.sh RUN [RUN...]   (COMMIT written out: no .git there)
# TOTAL: seconds this call may take in all (default 570). Folder names end in the GPUs a configuration spans and their kind
# (h100, h200); the 2-GPU runs need a 4-GPU host (two configurations at once, --parallel), except those written with
# $PAIRS, which run their configurations one after the other on a 2-GPU host.
# Runs (the objective each replay counts goodput under is fixed here, before the run):
#   exact4       Shift's base forced (th1) with and without --shift-exact, SP4 and SP2 x TP2, four dense families
#   q30_mooncake ZeroDP on the Mooncake conversation trace's first 60 s (Qwen3-30B-A3B, 2 + 2 GPUs at once; 2 s / 100 ms;
#                predicted on 2 x H100: TP2 best, ZeroDP sized for the window's context 0.87x)
#   q8_shift3x   Shift SP2 on the Azure code trace at 3x (Qwen3-8B, 2 + 2 GPUs at once; 1 s / 8 ms; predicted on
#                2 x H100: 1.88x TP2, the best vanilla configuration, 1.81x at the 2,048-token threshold Shift's
#                start-up calibration has picked so far; on 2 x H200 measured 1.18x)
#   q8_shift_th  q8_shift3x again (TP2, Shift, DP2), Shift's threshold now timed on the GPU (9e288ff). 1 s / 8 ms;
#                predicted on 2 x H100 (threshold 256): Shift 1.88x TP2, the best vanilla (measured 1.48x at 2,048,
#                18578a4), 0.97x DP2 at 1 s / 15 ms; on 2 x H200 (threshold 1,024, as measured): 1.10x DP2 at 8 ms,
#                0.70x at 15 ms (measured without DP2 on 2 x H200, 6607173: 1.37x TP2 at 8 ms)
#   q8_shift_chunk2x  Shift's base configuration at twice SGLang's chunk (each GPU 8,192 rows a forward) with the KV
#                of SGLang's own chunk (--mem-fraction-static as SGLang sets it for 8,192: 0.828 on H100, 0.902 on
#                H200), beside the default Shift and DP2, both Shifts at threshold 1,024 (_th1024 / _th1025: names
#                apart, the same buckets); burst 64 x (2,048, 32) and the Azure window at 3x (1 s / 8 ms). Expected from
#                the profiles (119 against 111 ms per 8,192 tokens): burst 0.90x -> about 0.96x DP2; not predicted by
#                the planner (it does not model a chunk flag)
#   q8_shift_rates  the same window at 1.5x and 2x (TP2, Shift, DP2; no burst): goodput where the load is lighter than
#                3x, whose 1 s / 8 ms goodput counts only 31-47 of 781 requests. Predicted on 2 x H100 at the
#                threshold the server calibrates there (1,024, measured twice): 1.5x: 8 ms Shift 1.21x TP2 (2.51 against
#                2.06 req/s), 10 ms 1.09x DP2, 15 ms 0.99x DP2; 2x: 8 ms 1.15x TP2, 10 ms 1.15x TP2, 15 ms 0.91x DP2
#   q8_shift_profile2k  Shift and TP2 at chunk 2,048 (each prefill forward 2,048 tokens: Shift's base configuration,
#                above its 1,024 threshold), 96 x (2,048, 8) profiled (3 prefill, 3 decode forwards): is the base
#                forward host-bound in the server? GPU-timed at start-up: base 28.6, TP2 30.4 ms. The planner serves
#                Shift's replay TTFTs 24-80 ms early (TP2's 0-26 ms): expected, if the cause is the host, a base span
#                well over its busy time (>= 1.3x) where TP2's is not
#   q8_par_check  does --parallel bias a ratio? Shift and DP2 on the 64 x (2,048, 32) burst side by side at the same
#                moment (GPUs 0,1 and 2,3), then each alone on GPUs 0,1, one after the other. In every --parallel run
#                of three configurations the third ran alone (DP2 in the Shift runs: Shift 0.87-0.89x DP2, and
#                0.93-0.95x in three runs each alone). Against the planner, the bursts run beside another on 4 x
#                H100 hosts came out a median 4.0 % under their predictions, those run alone 2.7 % (60 pairs); the
#                short Qwen3-8B bursts 5-12 % beside another, 1.6-5.3 % alone. Since then each --parallel burst's
#                client runs in a process of its own (the two had shared one Python process). Expected if that was
#                the cause, or the pairs never disturbed each other: the same Shift / DP2 ratio both ways within 2 %
#   q30_ep       vanilla DP attention with expert parallelism (`dp2_attn_ep`: --enable-dp-attention --ep-size 2),
#                never measured yet (it was left by a deadline), beside DP attention without EP, on the decode-heavy
#                burst 256 x (2,048, 256) where DP attention was the best vanilla configuration (q30_2gpu_h100) and
#                the prefill-heavy 64 x (8,192, 16). Not predicted (the planner has no EP shard yet); expected from
#                the FLOPs (the same per GPU: half the experts whole instead of every expert's half) within 10 % of
#                DP attention; a clear win would make it the baseline ZeroDP's MoE ratios must be taken against
#   q8_shift_blocks  Shift's base layer without its two layout copies (the QKV GEMM one per shift shard into the
#                all-to-all's send layout, the O GEMM one per received block), beside DP2 (one after the other on a
#                2-GPU host), Qwen3-8B: the burst 64 x (2,048, 32) and a profile of 64 x (2,048, 8). Expected from the
#                profile of before (q8_shift_2gpu_h100: per 8,192-token prefill 119 ms, "other" kernels 11.6 ms against
#                TP2's 7.2): "other" down by 2-4 ms, the prefill 2-3 % faster, the burst 0.87-0.90x DP2 -> 0.90-0.93x
#                on H100 (0.93x before on H200)
#   q8_shift_blocks3x  q8_shift_th (the burst and the Azure window at 3x, 1 s / 8 ms) with the copy-free base layer,
#                one after the other on a 2-GPU host (Shift, TP2, DP2). Expected: the burst 0.92-0.95x DP2 (0.94x in
#                q8_shift_blocks), goodput at 8 ms 1.3-1.6x TP2 (1.51x and 1.48x measured before), 15 ms about 1.0x DP2
#   q8_shift_busy  where Shift's replay time goes that the planner does not see: the Azure window at 2x (TP2 and
#                Shift, 1 s / 8 ms), each server with SGLang's per-forward device timer
#                (SGLANG_ENABLE_METRICS_DEVICE_TIMER=1: GPU seconds by forward category, counted over each replay),
#                `bench.validate --per-request` setting them beside the simulation's. The planner's Shift first tokens
#                are 30-80 ms early at 1.5x-2x (median; TP2's 0-10 ms), more so the longer the queue, though its
#                forwards are priced 5 % over the profiled ones. Expected, if the forwards run slower in the replay
#                than in bursts: Shift's measured prefill GPU time >= 1.1x the simulated while TP2's is within 5 %;
#                if not, the time is outside the forwards (host, scheduling)
#   a2a_shift    `bench.a2a` on 2 GPUs, Qwen3-8B and Qwen3-32B: Shift's two all-to-alls per layer by NCCL against copies
#                into the peer's symmetric memory (copy engines) and a barrier. Expected from the interconnect table
#                (peer copy 382 GB/s, NCCL all-to-all 259 GB/s bus) and the profile (8.0 ms of all-to-alls per
#                8,192-token Qwen3-8B forward: 0.22 ms a layer for 42 MB to the peer): the copies <= 0.6x NCCL's time
#                at 8,192 tokens; worth building into Shift's base layer only then (a 4-GPU host: Qwen3-32B at SP4 too)
#   exact2_shift  the forced base configuration with and without --shift-exact against TP2 on Qwen3 and Llama
#                distinct-weight checkpoints, 2 GPUs: --shift-exact bit-identical to TP2 as before the change above
#   cal_q32      plan calibrate of Qwen3-32B's shards for 2 GPUs, now with prefills of several prompts in one forward
#                (Calibration.prefill_multi_ms); expected: the TP1 shard's 2 x 4,096 chunk near 1,000 ms (fit of before:
#                946), so q32_sidp512's SiDP and DP2 bursts (+5.7 %, +4.4 %) within 3 % once re-validated with it
#   cal_q30      the same for Qwen3-30B-A3B: its TP1 fit puts 141 of an 8,192-token prefill's 239 ms in the square
#                term, so a 4 x 2,048 chunk is priced at 134 ms; expected: q30_mooncake's MoE bursts (TP2 +16.5 %,
#                DP2 +14.1 %) within 10 % once re-validated
#   cal_l70      the same for Llama-3.1-70B's shards for 2 and 4 GPUs. Its H200 TP1 table (one-request prefills alone)
#                prices a 4 x 2,048 chunk at 1,719 ms where SiDP DP4's measured ~1,880-1,930 ms (l70_auto512_4gpu_h200,
#                the log's prefill rate), so SiDP's bursts came 11-13 % over. Expected: the TP1 chunk near 1,900 ms and
#                l70_auto512/l70_sidp512 on 4 x H200 within 5 % once re-validated with it. Found at 3ab411a (140 s): the
#                TP1 chunk 1,752 ms, not ~1,900: the shard was priced right, the gap is SiDP's own (l70_sidp_prof)
#   l70_sidp_prof SiDP DP4 auto on Llama-3.1-70B profiled, 48 x (2,048 in, 8 out): 3 prefill forwards of 4 x 2,048 a rank
#                (SGLang's torch profiler). cal_l70 timed that chunk at 1,752 ms on the TP1 shard alone, where the burst's
#                log gave ~1,880-1,930 ms between SiDP's prefills. Expected: either the forward itself runs ~1.9 s (the
#                WaS pulls slow it: ~1.8 ms per GB pulled, against 0.33 measured in decodes) or ~1.75 s and the rest is
#                between forwards (host, lockstep waits). Found at d5a5c6a: the forward itself, 1,866-1,892 ms (1.48 ms
#                per GB pulled), now the planner's H200 prefill rate (steps.PREFILL_COPY_SLOWDOWN_MS_PER_GB)
#   q32_shift4   Shift on 4 GPUs, Azure code at 2x (Qwen3-32B; 1 s / 15 ms)
#   q32_shift4_15x  the same at 1.5x with vanilla DP4 beside (1 s / 15 ms; predicted on 4 x H200: SP2 x TP2 1.29x
#                and SP4 1.22x TP4, the best vanilla configuration, DP4 0; SP2 x TP2 1.27x at threshold 2,048;
#                on 4 x H100 SP2 x TP2 1.11x). Ran on 4 x H200 (q32_shift_1.5x_4gpu_h200): SP4 1.82x TP4. With the
#                all-to-alls priced on the buffers they send (0fae1bd), predicted on 4 x H100: SP4 1.28x TP4, SP2 x TP2
#                1.31x; the H100 folder's SP4, TP2 x DP2 and DP4 resume from .gpu/prev
#   q32_shift4_15x_sp4  only its SP4, into the same folder (a short call: SP4 first where the budget is small)
#   burst_twice  Qwen3-32B's 64 x (2,048 in, 32 out) burst twice in a row on TP4 and DP4 (`--burst-twice`): on 4 x H200
#                each TP group's first request of a burst came 0.2-0.4 s later than simulated, DP4's 0.09 s. Expected:
#                if a one-time cost, the second burst's first request within 0.1 s of the simulation's and its TTFT
#                p50 within 5 % (then the rehearsal should be the whole burst); if not, the same offset twice (then
#                the planner must price a burst's start. TP4's later batches keep a 0.24-0.34 s lag, so its GPU
#                starts late, not only its first token. One candidate: the scheduler taking in the burst's requests
#                before its first batch (DP4's ranks, 16 requests each, 0.09 s late; TP4, all 64, 0.34 s); TP2 x DP2,
#                32 a rank, was 0.4 s late, which that alone does not explain)
#   burst_intake burst_twice again with SGLang's per-request time stats (--enable-request-time-stats-logging: each
#                request's scheduler entry, queue and forward times in the server log; `bench.intake` reads them). On
#                4 x H200 (burst_twice_4gpu_h200) the late start came back in the second burst: TP4's first token at
#                0.30 s (0.42 s in the first burst; simulated 0.08 s), DP4's second batch 0.25 s late both times. Expected,
#                if the scheduler takes the burst in slower than the client sends it: the 64 entry times spread over
#                >= 0.2 s on TP4, and TP4's first request's forward entry within a few ms of its queue entry
#   burst_profile  where TP4's late burst start goes: TP4 and DP4 profiled from the burst's first forward
#                (--profile 64+2048+32 --profile-at-start, 4 prefill forwards one by one on every GPU) with the per-request
#                time stats. burst_intake_4gpu_h200 showed TP4 took the burst's first request in at 0 ms and the next
#                four at 61 ms, whose forward started then, but the one after only at 276 ms: the first forward, one
#                2,048-token request (76 ms simulated), ended ~270 ms in if a launch returns when the forward before it
#                ends, as it does on DP4's ranks (whose first forwards, one request each, ran on time). Expected: TP4's
#                first forward spans ~270 ms on its GPUs; if its all-reduces hold most of it, a TP rank started late;
#                the host's long CUDA calls (traced with it) show where the scheduler's thread waited for the GPU
#   q30_dpattn4  DP attention alone on q30_zerodp4's burst, with the rehearsal of a prompt a token shorter (8422f99):
#                in q30_zerodp4_4gpu_h200 every rank stalled 1.25 s before its last prefill, the first eager forward of
#                2,046-2,048 tokens a rank (57,899 tok/s; predicted 67,159). Expected: no such stall in the log (no
#                prefill line at under 10,000 input tokens/s in the burst) and about 66,000 tok/s, within 5 % of the
#                prediction
#   overlap_off  is TP4's late first token SGLang's overlap of two prefill batches? The Qwen3-32B burst 64 x (2,048, 32) on
#                TP4 as SGLang starts it, then TP4 and TP2 x DP2 with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1 (SGLang's
#                switch that processes a prefill batch's result before launching the next prefill). burst_profile_4gpu_h200
#                showed TP4's GPUs busy from the first kernel (forward 1: 78 ms, one request; then 8,192-token forwards of
#                ~275 ms back to back) while the host's launch of forward 2 returned only at ~358 ms, 9 ms before that
#                forward ended; the overlap loop processes forward 1's result (its first token) only after that launch.
#                Expected: with the switch, TP4's first token at ~0.1 s (0.30-0.42 s measured before; 0.08 s simulated) and
#                its TTFT p50 within 3 % of the simulation's 2,382 ms (-6.2 % before), throughput within 2 % of the default
#   q8_overlap   the overlap_off pair on Qwen3-8B TP2 at SGLang's chunk (CHUNK) of 2,048 tokens (a forward of one 2,048-token
#                prompt, ~25-30 ms, the size of an Azure replay's prefills), then at the default 8,192 if time is left.
#                The planner's release share (0.7, measured on TP4's 8,192-token forwards) over-predicts Qwen3-8B TP2's
#                replay TTFT p50 at 2x (+15-18 %). Expected, if the share is smaller on small forwards: each batch's
#                first tokens later with the overlap by well under 0.7 of a forward at 2,048 tokens
#   q8_overlap1  the same pair on one GPU (Qwen3-8B TP1, SGLang's chunk): the planner releases a one-GPU replica's first
#                tokens as its forward ends (share 0), from DP4's profile (the next launch returned 253 ms before the
#                forward before it ended). Expected: each batch's first tokens within 10 ms with and without the overlap
#   release_lead whether a prefill's first tokens wait a share of the next prefill or all of it but a lead:
#                Qwen3-8B TP2 at SGLang's chunk of 4,096 tokens, then Qwen3-32B TP2 at its default 8,192, each on the
#                burst 64 x (2,048 in, 32 out). q8_overlap_on_ch8192_2gpu_h200's last prefill (a decode launch after it)
#                left 60 ms after the one before, of ~120 ms forwards, and at chunks of 2,048 (~32 ms forwards) on
#                time: the lead model under test (not committed) releases them max(0, forward - 70 ms) into the next
#                forward. Expected: at 4,096 (~60 ms forwards) the last gap about one forward (on time); on Qwen3-32B
#                TP2 (~500 ms forwards) the last gap ~70 ms where a share of 0.72 would give ~140 ms. Found: 0.49 of
#                the forward at 4,096 and 0.72 on Qwen3-32B TP2, a share (technique.PREFILL_QUEUE_LAYERS)
#   shift_release  how late Shift SP2's base configuration releases a prefill's first tokens: Qwen3-8B shift_sp2_tp1 on
#                the burst 64 x (2,048 in, 32 out), the gap before its last prefill. The planner takes TP2's share
#                (0.5 for 36 layers) and under-predicts Shift SP2's TTFT p50 by 7-16 % on bursts. Expected: about 0.5
#                of the next forward as on TP2; more if Shift's collectives fill the launch queue sooner
#   q30_auto2    --overlay-mode auto on Qwen3-30B-A3B, 256 x (2,048 in, 256 out), beside TP2 and DP attention, one after
#                the other on 2 GPUs (resumable). On 2 x H100 auto started TP2 at 0.97x DP attention (q30_auto_2gpu_h100).
#                Predicted on 2 x H200 before the run: DP2 first (50,813 tok/s), TP2 0.96x, DP attention 0.95x, a near
#                tie. Expected: auto starts DP2 and is within 2 % of the best of the three measured
#   shift_twice  the burst 64 x (2,048 in, 32 out) twice on Qwen3-8B Shift SP2 and TP2 (--burst-twice). In
#                q8_shift_release_2gpu_h200 Shift's first tokens followed the simulation's 111 ms pace and tail to a few
#                ms but ~112 ms late from the first on (one forward): compare's rehearsal (two 2,048-token prompts)
#                never runs an 8,192-token forward. Expected, if the first such forward pays a one-time cost: the
#                second burst's first tokens within ~20 ms of the simulation's, TTFT p50 ~1,000 ms (1,107 first)
#   q8_warm      the burst 64 x (2,048 in, 32 out) once on Qwen3-8B TP2, Shift SP2 and DP2 after compare's full-chunk
#                rehearsal (7c9f80a). Expected: TP2's and Shift's first token at ~80-100 ms (83 and 94 on the second
#                burst of q8_shift_twice_2gpu_h200, 261 and 275 on the first), TTFT p50 within 5 % of that second burst;
#                Shift SP2 at 0.95x DP2 or more (0.93x on first bursts, q8_shift_3x300s_2gpu_h200). Found at 5d7d9ce:
#                193 and 165 ms (half the cost left), Shift 0.95x DP2; the rehearsal now sends one prompt more (a
#                burst's first forward takes its first request alone): run it again, expecting ~80-100 ms. Found at
#                c18f188: 215 and 184 ms (the rehearsal's full chunk in the log): not the chunk's shape; Shift 0.92x DP2
#   q8_gap       where a first burst's ~100 ms go: Qwen3-8B TP2, 64 x (2,048 in, 32 out) twice with 10 s of idle between
#                (--burst-twice --burst-gap-s 10) and SGLang's per-request time stats (bench.intake). In q8_shift_twice
#                the first token came at 261 ms the first time and 83 ms right after; q8_warm's full-chunk rehearsal left
#                it at 215. Expected: the second burst at ~83 ms if the cost is once after start-up, at ~200 ms if it
#                comes back after idle (GPU clocks, allocator); the intake tells a late intake from a late forward.
#                Found at 232cc90: 236 ms, then 74 ms after the 10 s idle (once after start-up)
#   l70_release  Llama-3.1-70B TP2 (80 layers) on the burst 64 x (2,048 in, 32 out), 2 x H200: the gap before its last
#                prefill. The planner releases a prefill's first tokens 1 - 18/80 = 0.775 of the way into the next
#                (technique.PREFILL_QUEUE_LAYERS, from Qwen3-32B's 0.72 and Qwen3-8B's 0.5), but l70_shift_4gpu_h200's
#                TP2 x DP2 replay reads TPOT p50 +33.9 % with it and +0.2 % with the next forward all but ~70 ms
#                (~0.93 of its ~1 s forwards). Expected: 0.775 if the queue holds a number of layers; ~0.93 if the
#                launch returns a fixed time before the forward ends. Found at c18f188: 0.78 (the layers model)
#   q32_sidp512  SiDP on many short prefill-heavy jobs, 512 x (2,048 in, 16 out) (Qwen3-32B, 2 + 2 GPUs at once;
#                predicted on 2 x H100 before the run: SiDP auto 1.14x TP2, the best vanilla configuration; its
#                prefill alone is 1.08x TP2 per GPU-second profiled, and SiDP bursts came 4-6 % over their predictions)
#   l70_sidp512  the same burst on Llama-3.1-70B, 4 GPUs (predicted on 4 x H100: SiDP DP4 auto 1.17x TP4)
#   l70_auto512  --overlay-mode auto on Llama-3.1-70B, 512 x (2,048 in, 16 out), beside vanilla TP2 x DP2, one after the
#                other on 4 GPUs (resumable). l70_sidp512_4gpu_h200 measured SiDP DP4 auto at 1.13x TP4 but ran no
#                TP2 x DP2. Predicted on 4 x H200 before the run: auto starts SiDP DP4 auto, 1.08x TP2 x DP2 (17,645
#                against 16,347 tok/s); SiDP came 11 % under its prediction there (15,880), so TP2 x DP2 may lead.
#                Expected: auto within 2 % of TP2 x DP2 or above it; if below 0.98x, the planner misses a winner.
#                Found at 3d3392b: auto started SiDP DP4 auto, 0.98x TP2 x DP2 (15,547 against 15,864 tok/s)
#   l70_pfonly   prefill-only on Llama-3.1-70B, 128 x (4,096 in, 1 out), SiDP DP4 WaS beside vanilla TP2 x DP2 on 4 GPUs,
#                one after the other (resumable). On 4 x H100 SiDP WaS ran 1.22x TP4, where TP2 x DP2 leaves no KV
#                (l70_prefill_only_4gpu_h100); on H200 TP2 x DP2 runs. Predicted on 4 x H200 before the run (270d1e9,
#                the pulls at H200's prefill rate): SiDP DP4 WaS 16,749 tok/s, 1.08x TP2 x DP2 (15,563), TP4 0.84x.
#                Expected: 1.03-1.10x TP2 x DP2 (the planner's SiDP bursts on H200 read +2.7 to +4.9 %).
#                Found at 232cc90: 1.07x (16,441 against 15,388 tok/s)
#   q30_zerodp4  ZeroDP with one source and three sinks on 4 GPUs (Qwen3-30B-A3B, default policy) against TP2 x DP2,
#                DP attention and TP4, one after the other, on the decode-heavy burst 256 x (2,048 in, 256 out) (two calls;
#                the second resumes). Predicted on 4 x H100: TP2 x DP2 best (68,495 tok/s), TP4 0.92x, DP attention 0.90x,
#                DP4 0.57x; ZeroDP's policy offloads nothing there, so the launcher declines with one line and starts
#                vanilla DP4 (expected about 0.57x the best, and the line in its log)
#   q8_twice3    Shift SP2 against DP2 and TP2 at steady state: Qwen3-8B, 64 x (2,048 in, 32 out) twice (--burst-twice),
#                two pairs at once on 4 GPUs. q8_gap_4gpu_h200 found a first burst's ~160 ms once after start-up (first
#                token 236 ms, 74 ms on a second burst after 10 s idle), and Shift's committed ratios are first bursts
#                (0.92-0.95x DP2). Predicted on 2 x H200 before the run (232cc90, steady state): DP2 70,184 tok/s,
#                Shift 0.95x DP2 (66,880), TP2 0.81x. Expected: on the second burst Shift 0.94-0.96x DP2.
#                Found at 2439645: 0.94x on both bursts (first and second within 2 % on all three)
#   q8_first_prof where a first burst's one-time cost goes: Qwen3-8B TP2 profiled from the burst's first forward
#                (--profile 64+2048+32 --profile-at-start, 4 prefill forwards on both GPUs) on a fresh server, then on a
#                server whose profiled burst is its second. Expected: the first burst's first forwards show host waits
#                (GPUs idle between kernels) or one slower kernel class that the second's lack. Found at 2439645:
#                kernels no slower; an 11.2 ms first cudaGraphLaunch (4,096 tokens) and TP-1 20.6 ms late on it
#   pull_cost    what NVLink weight pulls cost an H200's prefill GEMMs, and whether the SM clock says why
#                (python -m sgl_sidp.bench.pull_cost: Llama-3.1-70B's layer GEMMs in DP shapes, 8,192 tokens, 80 layers,
#                every GPU at once, alone and pulling 1.06 / 2.12 GB a layer from the next GPU, nvidia-smi sampled).
#                l70_sidp_prof_4gpu_h200 lost 1.48 ms per GB pulled in its prefill forwards (7 %). Expected: ~1.5 ms
#                per GB at 1.06 GB a layer; if the SM clock falls by the same share, the power limit is the cause.
#                Found at 49a19f0: 0.18-0.44 ms per GB (1-2 %), ~691 W and 1,440-1,470 MHz with and without
#   gemm_sustained whether an H200's GEMMs run slower under sustained load (its power limit) than in a short timing:
#                Llama-3.1-70B's layer GEMMs, 8,192 tokens, on one GPU (python -m sgl_sidp.bench.gemm) timed over 20
#                rounds (~0.4 s) and over 400 (~8 s), with nvidia-smi's SM clock and power alongside. pull_cost_4gpu_h200
#                found 20.5-20.8 ms a layer sustained at 1,455-1,470 MHz and ~691 W, and SiDP's profiled prefill GEMMs
#                the same per layer, while the TP1 shard's calibrated forward (1,752 ms) leaves its GEMMs at most ~19.
#                Expected: ~19 ms over 20 rounds, ~20.6 over 400, the clock falling with power at ~700 W.
#                Found at bf51a1f: 19.8-19.9 over 20, 20.4 over 400, ~1,465 MHz at ~692 W throughout
#   pull_gap     whether a TP layer's all-reduce gaps let an H200's GEMMs run faster under its power limit: pull_cost
#                again with --gap-ms 0,1.5,3 (a near-idle GPU after each layer, as TP2's all-reduces leave it) and
#                --gb-per-layer 0,1.06. gemm_sustained_1gpu_h200: GEMMs at ~692 W and ~1,465 MHz, 20.4 ms a layer
#                sustained against 19.8-19.9 in short timings. Expected: GEMMs 2-4 % faster per layer with 3 ms gaps.
#                Found at d1a75fc: 5.6-6.8 % faster with 3 ms, 2.7-3.2 % with 1.5 ms; pulls 0.25-0.63 ms per GB
#   gemm_sweeps  bench.gemm with its configurations timed in rotated order (--sweeps 5): Llama-3.1-70B at P = 1 (three
#                identical shapes: a check of the method, which gemm_sustained_1gpu_h200 timed 19.8, 20.9 and 20.1 ms one
#                after the other), then Qwen3-8B and Qwen3-32B at P = 2 (Shift's base against DP per token, on H200; on H100
#                gemm_shapes_h100 read 1.03-1.08x with DP timed first). Expected: P = 1 within 1 %; Shift base 1.00-1.05x DP.
#                Found at f888804: P = 1 within 2 % (spread 2-3 %); Shift base 1.01-1.03x DP
#   q32_auto4    --overlay-mode auto on Qwen3-32B, 4 GPUs, 64 x (2,048 in, 32 out), since a technique within the planner's
#                error (5 %) of the best vanilla configuration yields to it (80f89f8). Shift SP4 is predicted 1.01x DP4
#                there and measured 0.99x DP4 (q32_shift_1.5x_4gpu_h200). Expected: auto starts dp4 and says Shift's
#                predicted 1.01x in its line; ~30,400 tok/s on 4 x H200. Found at fc6ded9: dp4, the line as expected,
#                30,157 tok/s (predicted 31,187)
#   l70_tp2dp2_prof TP2 x DP2 profiled on l70_sidp_prof_4gpu_h200's burst (48 x (2,048 in, 8 out), 4 x H200), to place the
#                ~75 ms of SiDP's 1,877 ms WaS prefill forward that lie outside its GEMMs (attention 162-164 ms, ~64 the
#                rest) against its TP1 shard's calibrated 1,752. Expected: per GPU-second (a TP2 forward on 2 GPUs against
#                SiDP's on one), attention and the other kernel classes within 5 % of SiDP's; where SiDP's are larger,
#                that is where its time goes. Found at 909b970: TP2 forwards of 1,013-1,028 ms (2,024-2,056 GPU-ms per
#                8,192 tokens against SiDP's 1,889): GEMMs 1,580-1,606 GPU-ms (SiDP 1,637-1,660, +3-5 %), attention
#                155-158 (SiDP 162-164, +4 %), norm 47 (SiDP 25: TP repeats them), other 37 (SiDP 38.5), all-reduce
#                190-206. Outside its GEMMs SiDP spends no more than TP2 (227 against 240): its cost is its GEMMs',
#                the power limit's spells TP2's all-reduces relieve (~3 %, pull_gap) and its pulls (1.4-2.7 %)
#   q8_shift_stats  q8_shift_busy's Azure window at 3x (q8_shift_th's, 1 s / 8 ms), TP2 and Shift SP2 at once, with
#                SGLang's per-request time stats (each request's scheduler entry, the start of its first prefill forward,
#                its completion) and device timer. On q8_shift_th_2gpu_h200 Shift's first tokens of the requests that
#                arrived 20-30 s in came 0.82 s later than simulated (p50) and their decode windows ran 8.27 s against
#                6.20 (TP2: -0.16 s, 9.03 against 8.92), at the simulated GPU seconds. Expected: if it is the order the
#                scheduler runs them in, their prefill forwards start late by about as much; if it is the release of
#                results, they start on time and the client sees the first token later after the forward. Found at
#                937315f: neither alone. Each server completed its requests within 37 ms of the client's last token, and
#                took them in 40-106 ms after the send on both; the run again simulated Shift's prefill GPU seconds 5 %
#                short (25.58 against 26.92 s; TP2 +1.8 %): its forwards, priced short in the replay (q8_shift_prof)
#   q8_tp1_stats  q8_shift_stats' Azure window at 1.5x on one GPU, TP1, with the device timer and request stats: does
#                the TP1 table, which Shift's base configuration is priced from (its linears and attention x 1/SP), price
#                a saturated replay's served chunks (several prompts, continued prompts over their prefix, sizes between
#                the prefill graphs' buckets) as it prices fresh prompts? In q8_shift_stats_2gpu_h200 Shift's prefill GPU
#                seconds came 2.7 % over the simulated (26.92 against 26.22 s) while TP2's were within 0.2 %, and in the
#                saturated windows (20-30 s) Shift's servers prefilled 1.6 % (NCCL) and 4 % (overlap) fewer prompt tokens
#                a second than simulated, so the backlog drained later and decode windows ran 8.06 s against 6.80.
#                Predicted (planner of this commit): prefill GPU 48.7 s, decode 21.1 s, goodput 0.68 req/s (1 s / 8 ms),
#                TTFT p50 1,598 ms, TPOT p50 344 ms. Expected: if the TP1 table prices served chunks short, prefill GPU
#                seconds >= 50.0 (1.027x); within 1 % if not (then the miss is in the SP forward itself). Found at
#                3eaac89 (1 x H200): prefill GPU 47.77 s against 48.71 simulated (the table prices served chunks 2 % long,
#                not short), decode 21.61 against 21.10; goodput 0.68 (pred 0.68), TTFT p50 1,458 ms (pred 1,598), TPOT
#                p50 344 (344); every 10 s window's first tokens within 0.32 s and decode windows within 6 %. So Shift's
#                replay miss is in its SP forward on served chunks (about 4.7 % over TP1's price x 1/SP plus the
#                exchanges), not in the table; the fresh 4 x 2,048 forwards of q8_shift_prof were priced within 2 %
#   q8_shift_prof_cont  q8_shift_prof with prompts of 16,384 tokens: every prompt two chunks, the second over its
#                first's 8,192 tokens of KV, so 4 traced forwards are two fresh chunks and two continued ones, as most of
#                a saturated replay's chunks hold a continued prompt. q8_tp1_stats_1gpu_h200 put Shift's replay miss in
#                its SP forward on served chunks, while fresh 4 x 2,048 ones were priced within 2 %. Priced (planner of
#                the commit that adds this entry; mean of the two kinds): Shift SP2 201.9 ms (143.4 fresh, 260.3
#                continued), TP2 223.2 (163.3, 283.1). Expected: if the continued chunks are the miss, Shift's spans
#                >= 1.04x its price while TP2's stay within 3 %, and the kernel classes say which part (attention over
#                the prefix, GEMMs, exchanges)
#   q8_shift_prof  Shift SP2 and TP2 profiled at once on 128 x (2,048 in, 8 out), 4 prefill forwards of 4 x 2,048 each.
#                On H200 the planner prices them at 111.2 and 133.1 ms (0.835) and over-predicts Shift against TP2:
#                bursts +6.5 % against -2.1 % (q8_twice3_2gpu_h200), replay prefill GPU seconds +5.2 % against -1.7 %
#                (q8_shift_stats_2gpu_h200); on H100 the same forward was priced right (115 ms profiled). Expected: if
#                the miss is in the forward, Shift's spans >= 117 ms while TP2's are within 3 % of 133; the kernel
#                classes then say which part (GEMMs, attention, all-to-alls) the planner under-prices on H200. Found at
#                0a9fe1d: Shift 112-118 ms (GEMMs 76.5, attention 17.3, all-to-alls 8.3), TP2 125-131 (GEMMs 78.1,
#                attention 17.7, all-reduces 19.2): TP2 over-priced 5 % and Shift under 2 %, from the tables' one-request
#                prefills (cal_q8)
#   cal_q8       plan calibrate of Qwen3-8B's shards for 2 GPUs with prefills of several prompts (as cal_q32); and
#   cal_q32_4    of Qwen3-32B's for 2 and 4 GPUs. On H200 their tables hold one-request prefills alone, and
#                q8_shift_prof_2gpu_h200 found the planner's 4 x 2,048 chunk 133.1 ms on TP2 where the server ran 125-131
#                (its compute 106 ms busy, priced 115) and 111.2 on Shift SP2 where it ran 112-118: Shift 0.835x TP2
#                priced, 0.90x measured. Expected: the TP2 shard's 4 x 2,048 chunk 105-110 ms, so the planner's TP2
#                chunk within 3 % of the profile and Shift's bursts on 2 x H200 within 5 % once re-validated. Found at
#                dd790bf (218 s for both): the TP2 shard's chunk 107.2 ms, the planner's TP2 chunk 125.4 (128.3 with the
#                sustained clock, steps.PREFILL_SUSTAINED_FACTOR); Shift's bursts on 2 x H200 +1.2 to +12.2 % (+3.8 % on
#                q8_twice3, +6.5 % before). On H100 (not run yet; the same entry, tagged h100): the H100 Qwen3-8B tables
#                hold one-request prefills alone; the planner prices the 4 x 2,048 chunk at 134.5 ms on TP2 and 114.4 on
#                Shift SP2 (Shift's profiled 115). Expected: the TP2 shard's chunk 105-112 ms, the planner's TP2 chunk
#                ~125, and the 2 x H100 Shift SP2 bursts (+6 to +17 %) nearer once the tables take the points.
#                Again on H200 (since 7de4216 plan calibrate also times the stream at 512 tokens a request,
#                record_stream_length): expected the longer probe bound at 11-16K tokens/s on Qwen3-8B's shards, and
#                q8_decode2_alone's TP2 then predicted within 5 % (+6.6 % with one stream rate) once the tables take it.
#                Found at 04119be on a 1 x H200 host (155 s): no fall with length. At 128 and 512 tokens a request the
#                TP2 shard streamed 19,017 and 23,695 tokens/s, Shift's 15,605 and 18,063, the full model 20,590 (GPU-
#                bound) and 17,858: the longer probe was faster on two of three (the stand-in's 47 % fall is not the
#                server's). Predictions move under 1 % with these entries (q8_decode2_alone TP2 +5.9 %), so the bundled
#                tables keep their one rate (plan_multi_gpu/h200/calibrate_q8_stream/)
#                Again on H200 with decode points at 384 and 512 rows in graphs (calibration.table.DECODE_BATCHES): past
#                256 the planner went on along the 128-256 slope and priced the TP2 steps of Shift's server at 458-512
#                rows (ctx 1,100-1,250, q8_graphs512_shift_on_2gpu_h200) at 23.9-24.7 ms against 21.7-22.0 measured.
#                Expected: the TP2 shard's 512-row step at 256 tokens of context under the 10.1 ms the slope gives, and
#                the planner's TP2 step there within 5 % of the server's once the tables take the points
#                Found at ab5c019 (1 x H200, 130 s): the TP2 shard's 512-row step 10.50 ms (the slope's 10.12), at 2,048
#                tokens 31.86 (the slope's 37.8); the planner's TP2 step of Shift's server at 458-512 rows now -4.9 and
#                +0.6 % (+9.6 and +12.6 % before); the points joined the bundled tables (plan_multi_gpu/h200/calibrate_q8_512/)
#                cal_q32_4 and cal_l70 (and plan calibrate of Qwen3-30B-A3B and Mixtral-8x7B for 2 and 4 GPUs) again on
#                H200 for the same points. Found at de6319a (1 x H200, 197-394 s a model): 512-row steps of the dense
#                shards 5-12 % over the slope; joined the bundled tables; 4 x H200 replay TTFT/TPOT 24 -> 25 of 28
#                (q32_overlap_1.5x Shift SP4 TPOT -16.6 -> -12.0 %) (plan_multi_gpu/h200/calibrate_512/)
#                cal_q8 again on a 2 x H200 host (da19359, 178 s), for its stream probes: 12,816-22,734 tokens/s at 128
#                tokens a request and 13,666-20,064 at 512 across the five shards (the full model's 12,816 and 15,229),
#                where that host's servers probed 11,384-15,739 (q8_graphs512_incr_pair_2gpu_h200): a multi-GPU host
#                does not stream at one rate either (plan_multi_gpu/h200/calibrate_q8_2gpu_host/; not bundled)
#   cal_mx       Mixtral-8x7B's shards for 2 and 4 GPUs (its TP1 and DP-attention shards; SGLang cannot serve its TP
#                shards on one GPU). cal_q8 and cal_q30 now time 4 GPUs' shards too: on H100 every table stops
#                at 256 decode rows (plan names the configurations priced past them); cal_q8, cal_q30, cal_q32_4, cal_l70
#                and cal_mx on an H100 host give each the 384- and 512-row points, as calibrate_512 did on H200
#                After cal_q8 on H100 (several-prompt prefills): shift.planner.SERVED_BASE_PREFILL's H100 factor derived again
#                with bench.cadence over the H100 Shift replays (it rests on one-request prefill tables)
#   q32_burst2   out of sample for the H200 tables' several-prompt prefills and the sustained clock (4a422b9): Qwen3-32B,
#                64 x (2,048 in, 32 out), DP2, Shift SP2 and TP2 on 2 x H200 (pairs at once on 4), a model and node no
#                burst of these three had run on. Predicted before the run (plan --workload offline:64:2048:32): DP2
#                16,435 tok/s, Shift SP2 16,118 (0.98x), TP2 15,540 (0.95x). Expected: each within 5 %, and the order
#                DP2 > Shift > TP2 or a near tie between the first two. Found at 67b8091: DP2 16,540 (-0.6 %), Shift
#                15,768 (+2.2 %; 0.95x DP2), TP2 15,420 (+0.8 %), in that order; TTFT and TPOT p50 within 2 %
#   q8_graphs512 Shift SP2, TP2 and DP2 on 512 x (1,024 in, 256 out) at once, then Shift and TP2 again with
#                --cuda-graph-max-bs-decode 512 (q8_graphs512_on). SGLang 0.5.17 captures decode graphs up to 256 rows below TP4
#                on H200 and H100 and runs a larger batch eagerly; on a TP2 server such steps took 68-77 ms served at
#                430-512 rows where the planner prices 35-43 ms (q8_shift_stats_2gpu_h200, after its replay's backlog
#                drained, both Shift, whose decodes run TP2 below its threshold, and TP2; qwen3_8b_2xh200_decode_log),
#                while TP1's eager steps on one GPU came as priced (q8_tp1_stats_1gpu_h200: 40-60 ms at 387 rows). DP2's
#                replicas decode 256 rows each in graphs. Predicted (planner of the commit that adds this entry, which
#                prices an eager step as GPU-bound): DP2 53,280 tok/s, TPOT p50 35.5 ms; Shift 49,406 (0.93x), 38.8 ms;
#                TP2 45,143, 41.3 ms; with the flag (planned since a2ccd4b) Shift 50,277, 37.9 ms, TP2 45,869,
#                40.4 ms. Expected: with SGLang's graphs Shift's and TP2's TPOT p50 >= 60 ms (eager) and
#                their throughput >= 15 % under the prediction; with --cuda-graph-max-bs 512 each within 10 % of its
#                prediction. If so, Shift's SGLang default becomes 512 (its decodes below the threshold are TP at those
#                batches), and the comparison names that TP2 gains the same from the flag. Shift's half ran as
#                q8_graphs512_shift (1.80x) and its default is 512 since 845f4b5, so this run now sets Shift (512 either
#                way) and TP2 with the flag beside TP2 and DP2 as SGLang starts them: the ratios to the best vanilla
#   q8_graphs512_incr_pair  q8_graphs512_pair with SGLang's --incremental-streaming-output on both (Shift SP2, DP2): on
#                2 x H200 the output stream of whole-output chunks bound both at 34.8-34.9K tok/s while their servers
#                decoded 23.6K (Shift, 512-row graphs) and 2 x 12.6K (DP2) tokens/s; DP2 with the flag ran 43,300 on another host.
#                Expected: Shift about 0.93x DP2 (its servers' decode rates), the GPU-side ratio against Shift's goal of >= 0.95x DP
#                under high load; not predicted (the planner prices whole-output chunks: the flag is UNMODELLED_FLAGS').
#                Then Shift with --shift-threshold 256 (shift_sp2_tp1_th256) the same way: its decode steps of 257-512 rows
#                run the base configuration (SP2: each GPU 256 rows through the whole weights, as a DP2 replica, plus the
#                overlapped exchanges) where Shift's calibrated threshold (about 1,024 on H200) runs them TP2. Predicted
#                decode steps (planner of the commit adding it, `plan(decode_points=...)`, 512 rows at 1,152 tokens):
#                DP2 21.5 ms (a replica's 256 rows), Shift TP2 22.5, base 22.2; at 400 rows base 19.2 against TP2 17.3
#                (the base pays from about 480 rows). Expected: the base's 512-row steps within 3 % of DP2's (Shift's
#                decode-bound throughput about 0.96x DP2 against the TP path's 0.93x); if so, Shift's decode gets a
#                threshold of its own. Since decode512_log_1gpu (one H200: TP2's 512-row shard step 22.0 ms, a DP2
#                replica's 256 rows 22.2): both Shifts about 0.97x DP2, the base no faster than the TP path. Since
#                stream_probe_1gpu (a one-H200 host streamed 14.8-16.6K tokens a second with either chunk kind) the
#                clients here may still be stream-bound, so every server logs each decode step (--decode-log-interval
#                1): the GPU-side ratio is Shift's 512-row steps against DP2's ranks' 256-row steps, from the logs;
#                and each server's stream rate is probed after its warm-up (compare --stream-probe)
#                Found at da19359 (2 x H200): per-step logs, median over the 256 steps at 486-512 rows: Shift 23.12 ms
#                (TP2), DP2's ranks 21.74 and 21.86 at 243-256 rows, Shift th256 23.93 (the base, in its decode graphs
#                of 272-512 rows): GPU-side 0.943x and 0.911x DP2 (planner 22.5, 21.5 and 22.2 ms: -2.7, -1.1 and -7.2 %).
#                The clients: 36,741, 40,767 and 35,571 tok/s (0.90x, 0.87x), the servers' stream probes 11,936,
#                15,739 and 11,384 tokens a second
#   q8_decode_prof_pair  where a 512-row decode step's time goes, Shift's base (th256), DP2 and Shift's TP path: the
#                burst 512 x (1,024 in, 256 out) traced 10 s in (decode at 486-512 rows, prefill about 7 s), 3 decode
#                forwards per GPU by kernel class. Predicted (planner): DP2 21.5 ms (a replica's 256 rows), base 22.2,
#                TP2 22.5. Expected: TP2's communication class about 1.3 ms a forward (72 all-reduces of 4 MB at the
#                table's 2.9 us + 270 GB/s), its GEMMs and attention as DP2's; the base's 2.1 ms over DP2 either its
#                exchange kernels (copies into the peer's memory, about 2.6 MB a layer: 0.4 ms at 270 GB/s), waits
#                on the peer's signals (idle gaps inside the forward), or the head-order gathers around attention
#                Found at d1e6c52 (2 x H200), per forward (the 2nd and 3rd traced; span / busy, ms): DP2 21.9 / 21.7
#                (attention 14.7, GEMMs 5.9-6.0, other 0.71, norms 0.33), Shift's TP path 23.07 / 22.93 (attention
#                14.7, GEMMs 5.4, all-reduces and the logits' all-gather 1.44-1.50, other 1.06, norms 0.44-0.49; 0.949x
#                DP2), the base 23.6 / 23.0 (attention 14.4, GEMMs 6.4: the split QKV and O GEMMs, 72 calls of the
#                96x64 kernel at 1.07 ms where DP2 runs 36 of 96x128 at 0.78; barrier kernels and P2P copies 1.2,
#                other 1.07; idle 0.6; 0.928x). Attention, the Triton decode kernel on about 1,150 tokens of context,
#                is two thirds of every step and the same in all three
#   q8_decode_other_pair  q8_decode_prof_pair again for Shift as it starts and DP2, with each kernel class's heaviest
#                kernels kept (profile's by_class_top, 547412c): what the TP path's "other" (1.06 ms a forward against
#                DP2's 0.71) and norms (0.44-0.49 against 0.33) hold. Expected: the sampler's and the logits' work over
#                all 512 rows on each TP rank (DP2's ranks 256 each) about 2x DP2's, and the start-up calibration's
#                128-token TP2 prefill at 5-6 ms now that every TP rank sleeps as long before it (0c23f13; 21-22 ms in
#                the three 2 x H200 starts of da19359-ed511ee), the threshold again 512 tokens
#   q8_symm_ar_pair  q8_decode_prof_pair's profile of Shift (its TP path) and DP2 with SGLang's torch symmetric-memory
#                all-reduce in place of its custom one (--disable-custom-all-reduce --enable-torch-symm-mem: two-shot at
#                2 GPUs, multicast off). The custom all-reduce took 1.1 ms of a 23.07 ms TP2 step at 512 rows (73 calls of
#                4 MB, about 15 us each: 280 GB/s a direction of NV18's 450). Expected: if two-shot reaches 350 GB/s, the
#                comm class falls to about 1.2 ms and Shift's step to about 22.8 ms (0.96x DP2's 21.9); if not, the
#                custom all-reduce stays (DP2 runs TP1: the flags do nothing there)
#                Found at ed511ee (2 x H200): not what it was for. With the two-shot all-reduce the threshold calibration
#                timed Shift's TP2 prefills slower than the base at every size from 256 tokens (512: 9.7 against 8.2 ms
#                with the custom all-reduce), so the threshold fell to 0 and every forward ran the base: its 512-row
#                decode steps 23.85-23.99 ms against DP2's 21.8-22.1 (0.915x), as in q8_decode_prof_pair. The two-shot
#                all-reduce is slower than SGLang's custom one at these sizes; not pursued
#   q8_graphs512_pair  the short form of q8_graphs512 for a call with under 6 minutes of device time: Shift SP2 as it now
#                starts (512-row decode graphs, its default since 845f4b5: the default's first run on GPU) and DP2 at
#                SGLang's defaults, one after the other on 512 x (1,024 in, 256 out). Predicted (planner of 185b32a):
#                DP2 53,280 tok/s, TPOT p50 35.5 ms; Shift 50,277 (0.94x), 37.9 ms. Expected: Shift's log shows decode
#                graphs to 512 rows ("cuda graph: True" at 458-512 rows); Shift about 38,600 tok/s as with the flag by
#                hand (q8_graphs512_shift_on_2gpu_h200), so 0.72-0.80x DP2 if DP2 comes within 10 % of its prediction.
#                Predicted again at bb209a5 (Qwen3-8B's H200 tables with decode points to 512 rows): DP2 53,280, Shift
#                52,556 (0.99x), TP2 45,302 (b0aaf56, Shift's served base prefills priced: Shift 51,771, 0.97x); the burst's intake delays (1.1-2.1 s at 512 requests) are not in these
#                Found at 7a23ad8 (2 x H200, the first 2-GPU call in seven sessions): Shift 34,844 tok/s, DP2 34,933
#                (0.997x), TPOT p50 55.6 and 56.6 ms; Shift's log: 512-row steps in graphs (21.7 ms, as TP2 with the flag).
#                Both +49 to +53 % over-predicted: the servers' logs end the burst about 4 s before the client's last
#                token. Then TP2 with --cuda-graph-max-bs-decode 512 on the same host, 32,943 (0.94x DP2,
#                q8_graphs512_tp2_2gpu_h200), and DP2 with --incremental-streaming-output on another 2 x H200 host,
#                43,300 (1.24x across hosts, q8_graphs512_incr_2gpu_h200), its last token at 15.1 s with its server's
#                against 18.7. Next on such a host: cal_q8,
#                whose stream probes (256 streams of 128 and of 512 tokens) say whether plan calibrate on a multi-GPU
#                host measures the ~11K tokens/s these bursts fit (`validate --stream-tokens-per-s 11000`: -6.4 to +2.6 %)
#                where the one-H200 host's measured 15.6-23.7K; if so, a compare run can carry its host's stream rate
#   q8_flags_1gpu  Qwen3-8B TP1 on one GPU, 384 x (1,024 in, 128 out) at once, as SGLang starts it and then with
#                --chunked-prefill-size 4096 --cuda-graph-max-bs-decode 512 (q8_flags_on_1gpu): the SGLang flags the
#                planner models since a2ccd4b, held against one GPU (KV pool by SGLang's memory-fraction default, the
#                chunk, decode steps of 384 rows eager or in graphs). Predicted (planner of a2ccd4b): KV 803,751 and
#                830,092 tokens; 33,721 and 33,273 tok/s; TPOT p50 65.2 and 65.9 ms. Expected: KV within 0.5 %, burst
#                throughput within 10 %; on one GPU the eager steps are GPU-bound (q8_tp1_stats_1gpu_h200), so graphs
#                gain TP1 under 5 %. Found at 20d0532 (1 x H200): KV 803,502 and 829,855 (+0.03 % both); but the eager
#                steps of 384 rows took 47.5 ms (SGLang's log: 384 rows at 8,078 tok/s) against 28.6 in graphs (13,420),
#                so as SGLang starts it TP1 ran 27,097 tok/s, TPOT p50 89 ms (predicted 33,721 and 65.2: +24 %, -27 %),
#                and with the flags 32,090 tok/s, 68 ms (+3.7 %, -3.1 %): 1.18x from the decode graphs on one GPU
#   q8_eager_prof_1gpu  Where an eager decode step's extra 19 ms go: TP1, 384 x (1,024 in, 16 out) profiled (3
#                decode steps of 384 rows) as SGLang starts it (eager) and with --cuda-graph-max-bs-decode 512 (graphs).
#                Expected: if the eager steps' kernels run as long as the graph's (28.6 ms) and the rest is gaps, the
#                host's launches and the scheduler's per-request work are serial with the GPU's (a model: step = GPU +
#                host); if the kernels themselves take longer (attention's split chosen per batch in eager mode), the
#                attention class shows it. Found at a7caf76: the eager forward's kernels span 31.1 ms (busy 28.7;
#                graphs 29.4 and 29.1): the other 16.4 ms of a served eager step are outside the kernels, the host's
#   q8_eager_ctx_1gpu  Qwen3-8B TP1 eager 384-row decode steps at two more contexts: 384 x (128 in, 128 out) and
#                384 x (2,048 in, 128 out) as SGLang starts it (graphs to 256 rows). With q8_flags_1gpu_h200's 1,024
#                tokens (47.5 ms served; kernels 31.1 ms, graphs 28.6) they say whether the scheduler's work between
#                eager forwards grows with the context (16.4 ms for 384 requests at about 1,100 tokens, where the
#                calibration's probe at 16-217 tokens found 4.4 ms). Predicted (planner of ea8db34: max(GPU, eager step)
#                + the calibrated work): the steps at about 190 and 2,110 tokens of context. Expected: served minus the
#                graph model's GPU step, per request, the same at all three contexts if the work does not grow. Found
#                at f8408b9: 342 rows at about 225 tokens 27.1-27.7 ms, 376 rows at about 2,100 tokens 44.5-45.0 ms
#                (GPU-bound: the 2,048 burst came within 0.0 % of its prediction), less than at 1,100 (47.5): neither
#                a per-request constant nor the requests' work after the forward (tried at ea8db34, reverted) fits all
#                three; max(GPU, launches + 0.022-0.072 ms a request) does. The 128-token burst +45.8 % (TTFT -56 %)
#   q8_eager_host_1gpu  where an eager decode step's 16.4 ms outside its kernels go, from the host's side: TP1 as SGLang
#                starts it, 384 x (1,024 in, 16 out) profiled with the host traced by aten op and CUDA call
#                (--profile-host calls, little overhead), again by Python function (frames: the tracer slows the
#                host, for names only), and 384 x (128 in, 16 out) by calls (q8_eager_ctx128's 27.4 ms steps).
#                profile.host_timeline gives per forward the launches' span, the GPU's lag behind the last launch and
#                the host's gap before the next forward. Expected at 1,024: launches about 30 ms with the GPU close
#                behind (lag under 3 ms: launch-bound), a gap of about 16 ms in which the GPU idles (step = launches +
#                gap, not max(GPU, ...)); at 128, launches shorter (the attention kernels' work per launch smaller)
#                or the gap shorter: which one says which term grows with the context
#                Found at 69f6109: the first eager decode forward of 384 rows is slow (launches 174 ms, 16 tokens'
#                burst: Triton's first launches of those shapes, load_binary among them); the next two took 25-30 ms of
#                launches with the GPU right behind (29-30 ms span, busy 27.5) and a gap of 5.6 ms (process_batch_result
#                2.5, by frames the output streamer's accept 5.3 of its slowed host): about 31-35 ms a step, where
#                SGLang's log of q8_flags gave 47.5 averaged over 40. At 128 tokens: launches 24-33 ms with the GPU
#                behind (busy 13.6 of 32.1: launch-bound), gaps 1.4-4.8; the forward's Python 14.6 ms
#   q8_eager_late_1gpu  q8_flags' burst 384 x (1,024 in, 128 out), its decode traced 13 s in (about 60 steps after the
#                first: --profile-after-s 13; prefill about 10 s), host by calls, then by frames. Expected: if late steps
#                run as q8_eager_host's second and third (31-35 ms), SGLang's 47.5 ms average over 40 steps hides
#                something else (a periodic slow step, or work growing with the output length); if they take
#                about 47 ms, the gap or the launches grow along the decode, and the table says which
#                Found at abb77c0: late steps launch-bound (launches 57-70 ms, the GPU's span the same, lag 0.002), gaps
#                10.7-10.9 ms (process_batch_result 9.5); every host item about 2x the second and third steps' (aten::mm's
#                host time 7.7 against 2.9 ms a forward), by frames 3.5x (the output streamer's accept 19.7 against 5.3 ms
#                a gap). SGLang's log: 40-step averages 46-49 ms from the first 40 on, so the fast steps are the first
#                few, not a growth along the decode. The host (a 16-vCPU VM, 2.1 GHz) ran one spinning process 30 %
#                slower with 4-16 spinning beside it; no cgroup throttling (cpu.stat nr_throttled 0)
#   q8_eager_si8_1gpu  whether streaming is what slows the host's eager steps: the same burst and late profile with
#                --stream-interval 8 (the scheduler sends each stream's tokens every 8 steps: its output streamer,
#                the detokenizer, the tokenizer manager and the client do an eighth of the per-step work), beside
#                interval 1 (SGLang's default) in the same call. Expected: if streaming (the scheduler's own work or
#                the other processes' contention for the host) is the cause, interval 8's late steps near 32 ms
#                (launches about 27, gap about 5) and its burst faster; if not, both about 47 ms
#                Found at e2bda12: neither. Each burst's eager steps settle at one of two speeds, whatever the interval:
#                interval 1's burst 28.5-29.5 ms a step (SGLang's log: 13,550 and 13,005 tok/s, the GPU's own 28.6),
#                its profiled burst 29.9; interval 8's burst 43.8 (8,756 and 8,771), its profiled burst 28.8;
#                q8_flags' 47.5. Traced late: 45-50 ms (launches 35-41, gaps 9.5) at interval 1, 34-36 (30-33, 3.1-3.7)
#                at 8. The lent VM's vCPUs run one spinning Python process at 4.5 to 8.0 M loop turns a second
#                (taskset on each of 16, with another on vCPU 0: up to 1.7x apart, not by sibling pairs): a
#                launch-bound step takes as long as the vCPU the scheduler landed on makes it, 1.5-1.7x apart
#   q8_intake128_1gpu  where the 128-token burst's first tokens go (q8_eager_ctx128_1gpu_h200: TTFT p50 1,345 ms against
#                588 simulated, +46 % on throughput): Qwen3-8B TP1, 384 x (128 in, 128 out) with SGLang's per-request
#                time stats (bench.intake). Its log then showed 42 requests prefilled within about 0.1 s, 0.7 s of
#                decode steps of those 42 with no request queued, then the other 342 at once. Expected, if the server
#                takes the burst in late (the HTTP side, not the scheduler): entry times of about 40 requests within
#                0.1 s and the rest 0.7-1.2 s later, each with a queue time of a few ms at most; if the scheduler
#                holds them, entries within 0.1 s and long queue times
#                Found at 0e2b7bc: the server took the burst in late, in clumps: 94 requests within 83 ms, 13 at 197 ms,
#                none until 591 ms, then 140 by 632 and 145 at 774-779 ms (the client had sent all 384 within 92 ms); each
#                prefill started within 3 ms of its intake, but the first tokens of the first 94 reached the client only
#                at 786 ms: the HTTP process (tokenizer manager) took 0.78 s for the burst and delivered nothing
#                meanwhile. TTFT p50 1,051 ms (13,824 tok/s, TPOT 44 ms: this burst's eager steps host-bound)
#   q8_intake_gc_1gpu  the same with SGLang's --gc-warning-threshold-secs 0.02 (a line for every garbage collection
#                over 20 ms in the tokenizer manager): expected, if the 400 ms pause in the intake is a full collection
#                of the HTTP process's objects, one such line of 0.2-0.4 s during the burst; if none, the pause is
#                the event loop's own work (the first streams' outputs, the requests' parsing)
#                Found at 185b32a: one generation-2 collection of 0.376 s (857,374 objects) in the tokenizer manager during
#                the burst, the only long one of the run; the intake paused from 306 to 756 ms (94 requests taken in
#                by 151 ms, 72 at 303-306 ms, 146 at 756-761 ms). TTFT p50 879 ms, 18,747 tok/s, TPOT 33.3 ms (its eager
#                steps fast this time). SGLang's /freeze_gc is its remedy; no server here calls it
#   q8_intake_frozen_1gpu  the same burst after SGLang's /freeze_gc (compare --freeze-gc), with the request stats and the
#                GC warnings: expected no long collection, the intake over about 0.3-0.4 s (94 requests in 151 ms
#                before, 72 more by 306 ms) and TTFT p50 300-400 ms under q8_intake_gc's 879 ms; what remains over the
#                planner's 588 ms is the HTTP process's own pace (about 1 ms a request)
#                Found at c32a60d: frozen (SGLang's log: 778K, 857K and 699K objects frozen in the tokenizer manager,
#                scheduler and detokenizer), one 20 ms collection; the intake took 0.441 s (0.76-0.78 before), still in
#                clumps (48 by 82 ms, 55 at 255-283, 120 at 330-334, 161 at 434-441 ms). TTFT p50 897 ms, not lower:
#                the prefill backlog left at 441 ms (about 290 prompts) took five forwards of 8,192 tokens, 180-190 ms
#                each, to 1.0 s; its eager steps ran host-bound again (TPOT 45.9 ms, 14,277 tok/s). A uniform intake of
#                1.1 ms a request would move the simulated TTFT p50 little (the clumps come late)
#   q8_intake512_1gpu  the large-burst intake on one GPU: Qwen3-8B TP1, 512 x (1,024 in, 64 out) with the request stats and
#                SGLang's garbage-collection warnings. In both 512 x (1,024, 256) Shift bursts on 2 x H200 the first 33
#                and 54 requests were taken in, then decoded alone for 1-2 s before the rest reached the scheduler.
#                Expected, if that is the tokenizer manager's full collection: one LONG GARBAGE COLLECTION line of
#                0.4 s or more during the burst, and the intake paused as long
#                Found at f7c3df4: one generation-2 collection of 0.448 s (853,928 objects); 36 requests taken in by 60 ms,
#                none until 909 ms, all 512 by 1,128 ms. The scheduler prefilled the 36 meanwhile (to 552 ms), then
#                had nothing to prefill for about 0.37 s. Burst 35,164 tok/s, predicted 37,252 (+5.9 %), TTFT p50 -1.1 %
#   q8_graphs512_shift  q8_graphs512's Shift alone, SGLang's decode graphs then --cuda-graph-max-bs-decode 512, where a
#                call has time for two servers only. Expected as there: Shift's TPOT p50 >= 60 ms eagerly, within 10 %
#                of its prediction (37.9 ms) with the flag, its throughput >= 1.15x. Found at 60b29fb (2 x H200):
#                eagerly 21,503 tok/s, TPOT p50 102 ms (SGLang's log: 512 rows at 73.9 ms a step; predicted 49,406 and
#                38.8: +130 %); with the flag 38,632 tok/s (1.80x), TPOT p50 46.6 ms (458 rows at 21.7 ms; predicted
#                50,277 and 37.9: +30 %, -19 %); KV 0.4 % less. Shift's SGLang default is 512 since (shift.feature)
#   q8_decode2   Shift SP2 against DP2 under a decode-heavier high load: Qwen3-8B, 256 x (1,024 in, 512 out) at once, DP2,
#                Shift SP2 and TP2 on 2 x H200 (pairs at once on 4). Shift ran 0.92-0.95x DP2 on the prefill-heavy
#                64 x (2,048 in, 32 out); its decodes run TP2, whose steps cost less GPU time a token than DP2's at these
#                batches. Predicted before the run (plan, 6030b8f): DP2 35,230 tok/s, Shift 35,225 (1.00x), TP2 33,891
#                (0.96x). Expected: Shift >= 0.95x DP2, each within 5 % of its prediction. Found at ea05042: not what it
#                meant to test. DP2 27,840 tok/s (+26.5 % predicted), Shift 24,916 (0.89x; +41 %), TP2 25,607 (+32 %). The
#                servers' logs show decode steps of 256 rows in 14-17 ms on all three (DP2 128 a rank), where the clients
#                saw TPOT p50 23.6-26.8 ms: the output stream (tokenizer manager, HTTP, one client) bounded all three at
#                ~11K tokens/s, below the planner's stream rate
#   q8_decode2_alone  TP2 alone on that burst (no second server and client on the host). Expected: if the pairs'
#                host contention bounded the stream, TPOT p50 under 20 ms; if the stream of one server, ~25.6 again.
#                Refused at first (the tree over the 64 MiB a call carries). Found at 15b0b94 on a 2 x H200 host: 31,803
#                tok/s, TPOT p50 20.0 ms (predicted 33,891 and 18.7), the server's steps as in q8_decode2 (14.5-16.9 ms).
#                But q8_decode2's TP2 had run alone too (after the pair had stopped, 18:11), at 25.6 ms: the output
#                path's rate moved 24 % between two hosts with the same steps, not the pair's contention
#   a2a_overlap  one layer's QKV and O GEMMs of Shift's base configuration with their exchanges (bench.a2a --layer):
#                the GEMMs alone, NCCL's all-to-alls after and before them (the server's default), and the copies hidden
#                behind them (--shift-all-to-all overlap: the peers' QKV blocks first, put by the copy engines while
#                the GPU computes its own; the attention output put while it multiplies its own heads' block).
#                Qwen3-8B and Qwen3-32B at SP2 (and Qwen3-32B at SP4 on 4 GPUs). The exchanges cost 8.3 ms of Shift's
#                112-118 ms 4 x 2,048 forward (q8_shift_prof_2gpu_h200). Expected: at 8,192 tokens and more the
#                overlapped layer within 15 % of the exchanges' NCCL time over the GEMMs alone (>= 5 ms of a Qwen3-8B
#                8,192-token forward saved at SP2); less hidden at 2,048 tokens; at SP4 the copies ran 1.1-1.6x NCCL's
#                time alone, so less there
#   q8_overlap   Shift SP2 with --shift-all-to-all overlap beside the default (NCCL) and DP2, TP2: Qwen3-8B, 64 x (2,048
#                in, 32 out) twice (pairs at once on 4 GPUs). Shift ran 0.92-0.95x DP2 on this burst (q8_twice3, q8_warm).
#                Expected (if a2a_overlap saves >= 5 ms a forward): Shift overlap >= 1.03x Shift NCCL and >= 0.96x DP2
#                on the second burst. Found at af63d80 (a2a_overlap and q8_overlap on one 4 x H200 host): the exchanges
#                over the GEMMs alone per forward, NCCL -> overlap: Qwen3-8B SP2 6.77 -> 0.56 ms at 8,192 tokens and
#                14.13 -> 1.78 at 16,384 (worse at 2,048: 7.15 -> 8.70, host-bound in the bench); Qwen3-32B SP2 26.79 ->
#                2.90 at 8,192; Qwen3-32B SP4 worse up to 8,192 (14.62 -> 18.04), better at 16,384 (30.89 -> 7.32). The
#                servers' start-up timings on the GPU (launches hidden): Shift's base prefill 127.2 against 133.6 ms at
#                8,192 tokens, 25.1 against 27.1 at 2,048, lower at every size. Second burst: Shift overlap 64,700 tok/s,
#                1.035x Shift NCCL (62,526), 0.97x DP2 (66,506), TP2 57,675
#   q32_overlap  the same at SP4 and SP2 on Qwen3-32B: SP4 overlap and SP4 NCCL on 4 GPUs, then SP2 overlap beside DP2
#                (64 x (2,048 in, 32 out) twice). Shift SP2 ran 0.95x DP2 (q32_burst2_2gpu_h200: 15,768 against 16,540).
#                Expected: the SP4 base prefill timings at start-up within 3 % of each other from 4,096 tokens up (the
#                bench's copies lost at SP4 up to 8,192), its bursts within 3 %; SP2 overlap >= 0.97x DP2. Found at
#                bfc0ca4: SP4 overlap 30,931 tok/s against SP4 NCCL 30,189 (1.025x) on the second burst; SP2 overlap
#                16,223 against DP2 16,273 (1.00x; NCCL's Shift had 0.95x in q32_burst2)
#   q8_overlap3x q8_shift3x with --shift-all-to-all overlap: Qwen3-8B, the Azure code window at 3x (TTFT 1 s, TPOT 8 ms),
#                Shift overlap beside DP2, then TP2. NCCL's Shift had 1.18x the best vanilla there (q8_shift_3x300s_2gpu_h200).
#                Expected: >= 1.2x the best vanilla configuration's goodput, and the burst >= 0.96x DP2. Found at
#                8c3e3f5: goodput 1.81 req/s against TP2's 1.32 and DP2's 1.04 (1.37x); burst 64,138 tok/s, 0.98x DP2
#   q32_overlap15x  Qwen3-32B on 4 GPUs, the Azure code window at 1.5x (TTFT 1 s, TPOT 15 ms): Shift SP4 overlap against
#                TP2 x DP2, the best vanilla configuration there (NCCL's SP4 had 1.20x it in q32_shift_1.5x_4gpu_h200; TP4
#                and DP4 less). Expected: >= 1.2x TP2 x DP2's goodput
#   q32_overlap15x_all  q32_overlap15x with every vanilla configuration beside Shift SP4 (its exchanges overlapped, the
#                default since 28d7023): TP4, TP2 x DP2, DP4, one after another (two calls: the second resumes the first
#                from .gpu/prev/). Predicted before the run (bench.goodput --predict, 1055dca, 4 x H200; the same at 7ebe71e but 1.07x DP4 at 2 s / 100 ms; at b0aaf56, Shift's served base prefills priced: SP4 0.688 req/s, 1.24x at 20 ms, 1.07x at 50 ms, 1.03x at 2 s / 100 ms): at TTFT 1 s /
#                TPOT 15 ms SP4 0.717 req/s, TP4 0.368, TP2 x DP2 0.261, DP4 0; at 20 ms SP4 1.29x TP2 x DP2; at 50 ms
#                1.16x TP2 x DP2; at 2 s / 100 ms 1.09x DP4. Expected: SP4 >= 1.2x the best vanilla at 15 ms and >= 1.0x
#                at the looser objectives
#   overlap_graph  tests/gpu/test_shift_overlap_gpu.py: both overlapped exchanges of two Qwen3-8B SP2 layers (4,096
#                tokens) captured in one CUDA graph on a side stream, as SGLang's breakable prefill graphs capture them,
#                replayed 8 times on fresh inputs against NCCL's all-to-alls run eagerly. Found at 6281f80 (2 x H200): SP2
#                passes, QKV blocks equal to the bit (16 of 16), O error 0.0; SP4 not run (2 GPUs). The servers of the overlap runs
#                measured speed on dummy weights, not answers. Expected: passes at SP2 and, on 4 GPUs, SP4 (QKV blocks
#                NCCL's to the bit, O within bf16 rounding). Not run yet: the session that wrote it (30c098b) had no
#                device time left. Since 1b13b69 the exchange holds each put source until its barrier; the SP4 runs before
#                it (q32_overlap, q32_overlap15x) could have had a peer's QKV block overwritten by the next block's GEMM
#                while its copy read it (the same kernels, so speed as measured; their answers were not checked).
#                Found at 5ff5c26 (1 x H200, reverted after): two processes on one GPU cannot stand in for it, torch
#                refuses the rendezvous ("detected allocations from overlapping devices from different ranks")
#   q8_shift_sp1_1gpu  is Shift's served-prefill cost (SERVED_BASE_PREFILL: busy servers' base chunks 1.8-6.5 % over
#                their price, TP's and DP's not) in its hooks? On one GPU, `--shift-sp 1` runs every forward above the
#                threshold through the overlay's own hooks and GEMMs on TP1's weights, with no exchange: Qwen3-8B
#                shift_sp1_tp1_th1024 and TP1, one after the other, the burst 64 x (2,048, 32) and the Azure code window
#                of 120 s at 2x (1 s / 8 ms), with SGLang's device timer and request stats. Expected, read by
#                `bench.cadence`: if the hooks cost it, Shift SP1's full chunks >= 2 % longer than TP1's while their GPU
#                seconds per prefill token agree; within 1 % if the cost is the SP exchange in a busy server. Found at
#                b260206 (1 x H200; the window again at 4x in q8_shift_sp1_4x_1gpu_h200): no cost in the hooks. The
#                window holds 63 requests (8.8 s at 2x, 6.0 s at 4x: short, busy). Full 8,192-token chunks back to
#                back (SGLang's log): Shift SP1 median 210.0 ms against TP1 211.2 (burst and 2x window, 21 chunks
#                each), 238.6 against 238.8 at 4x (11). GPU seconds busy over each replay (device timer): 6.782
#                against 6.783 s, 5.594 against 5.596. Burst 33,964 against 34,160 tok/s (0.99x). So
#                SERVED_BASE_PREFILL's cost is in what SP > 1 adds (the exchanges, the token split, GPUs in step),
#                not in the hooks or the overlay's GEMMs
#   long_ctx_1gpu  decode steps far past the calibrated 2,048 tokens of context (`calibration.table.
#                LONG_CONTEXT_KV_GBPS`): Qwen3-30B-A3B's TP2 shard on one GPU, batches 1, 16 and 40 at 2K, 8K and 16K.
#                On H200 (f8a6cb6) the 40-row steps read their KV at 3.0-3.1 TB/s, so H200's rate is 2,800 GB/s
#                (`benchmarks/results/plan/validate_1gpu_h200_long_context_moe_2026-11-29/`). Expected on H100, where
#                the planner extrapolates the two calibrated contexts: rows at about 2,000 GB/s (H200's share of its
#                4.8 TB/s, at 3.35) and the 40-row steps priced 10-20 % long, as on H200 before
#   prefix_probe_1gpu  prefills over 8K-24K of cached prefix, one at a time, on TP1 served by SGLang (the trace
#                `python -m sgl_sidp.bench.traces prefix-probes` writes: two 24,576-token bases, then 8,192 and 2,048
#                new tokens over 8,192, 16,384 and 24,576 of each): Qwen3-30B-A3B, Qwen3-8B, then Qwen3-32B. Checks
#                `ShardClock.prefix_line` held past the calibration's longest prefix probe (16,384) and
#                `prefix_new_scale` past 8,192 cached. Predicted TTFT (ms; planner of the commit adding it; 8,192 new
#                over 8K/16K/24K, then 2,048 new over the same): Qwen3-30B-A3B 533, 1,044, 1,447; 126, 264, 373.
#                Qwen3-8B 504, 854, 1,141; 117, 214, 293. Qwen3-32B 1,918, 3,391, 4,522; 422, 775, 1,047. Found at
#                f249308 (1 x H200; its commands labelled 1c0c3b1 by a typo, mended): 521, 1,079, 1,488; 128, 258, 363.
#                488, 893, 1,204; 118, 213, 293. 1,851, 3,287, 4,393; 410, 757, 1,037: every probe within 5.2 %
#   prefix_probe_shards_1gpu  prefix_probe_1gpu's trace on TP2 shards served alone (their shapes on one GPU, as
#                long_ctx_1gpu): Qwen3-30B-A3B, Qwen3-8B, then Qwen3-32B (python -m sgl_sidp.bench.validate_1gpu measure). The TP
#                shards' probes of 8,192 new tokens sit lowest against the line (`prefix_new_scale` r 0.64-0.80). Found
#                at cb2fe1b (1 x H200; Qwen3-32B in a second call): 8,192 new over 16K-24K at 0.89-1.01x the line's k,
#                where r held had priced them 7-17 % short; so r now fades to 1 from 8,192 to 16,384 cached
#                (`benchmarks/results/plan/validate_1gpu_h200_prefix_probes_2026-11-29/`)
#   prefix_probe_2gpu  prefix_probe_1gpu's trace on TP2 of Qwen3-30B-A3B and Qwen3-8B, 2 GPUs. On one H200 the TP2
#                shards alone ran 8,192 new tokens over 16K-24K of cached prefix at the line's k (0.89-1.01x), which
#                `prefix_new_scale` now fades to, while the Mooncake replay's served TP2 forwards over more than 8,192
#                cached tokens had looked 11.5 % cheaper than the line (q30_mooncake_2gpu_h200; its TP2 TTFT p50 went
#                from -2.7 to +15.5 % with the fade, H100's goodput from +23.3 to +2.8 %). Predicted TTFT (ms, planner of
#                the commit adding it; base, then 8,192 new over 8K/16K/24K, 2,048 new over the same): Qwen3-30B-A3B TP2
#                on H200 989; 291, 552, 755; 79, 133, 184 (on H100 1,000; 295, 556, 759; 77, 137, 188). Expected:
#                within 5 % as on one GPU; if served TP2 runs the long-prefix probes 10 % under, a served forward
#                differs from the shard alone there, and the fade is priced per configuration. With the fade ending at
#                32,768 (`steps.PREFIX_FADE_END`, session 41): Qwen3-30B-A3B on H200 929; 291, 492, 710; 79, 133, 184
#                (H100 962; 295, 518, 731; 77, 137, 188); Qwen3-8B on H200 878; 270, 445, 618; 68, 116, 156 (H100 883;
#                275, 446, 625; 70, 117, 159). Run it with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (added since)
#                Found at da19359 (2 x H200): Qwen3-30B-A3B 943; 296, 521, 752; 86, 136, 191 ms, Qwen3-8B 887; 274,
#                469, 620; 74, 120, 160: every probe within -0.3 to -8.5 % of the planner's TP2 (bench.prefix_probes
#                --gpus 2 --config tp2; multi_gpu/prefix_probe_2gpu_h200/probes.md): served TP2 runs the long-prefix
#                probes as the shards alone do, not 10 % under
#   q30_mooncake_1gpu  q30_mooncake's trace window on TP1 of Qwen3-30B-A3B on one GPU at half its rate: served
#                chunks over long prefixes, one GPU, against the isolated probes (prefix_probe_1gpu). Predicted on H200
#                (planner of the commit adding it): TTFT p50 6,325 ms, TPOT p50 115.1, goodput at 2 s / 100 ms 0.080
#                req/s; with the new tokens' discount held past 8,192 cached (cb2fe1b) 5,564, 113.8, 0.140. Expected:
#                the first, if a served forward over a long prefix costs what the probes do. Found at bebe22a
#                (1 x H200): TTFT p50 6,024 ms, TPOT p50 117, goodput 0.0831 (fade +5.0 %, -1.8 %, -3.7 %; held -7.6 %,
#                -2.7 %, +68 %): on one GPU a served forward over a long prefix costs what the probes do
#   q30_mooncake_shard_1gpu  q30_mooncake's trace window at its rate (1x) on Qwen3-30B-A3B's TP2 shard served alone
#                on one GPU (the config.json of prefix_probe_shards_1gpu's results; TP2's KV tokens within 1.1 %), with
#                SGLang's device timer: TP2 without its all-reduces. On 2 x H200 served TP2 measured TTFT p50 1,540 ms,
#                TPOT p50 77.8, goodput 0.80 req/s, where the planner says 1,779, 80.2, 0.67. Predicted for the shard
#                alone (planner of the commit adding it): TTFT p50 1,550 ms, TPOT p50 74.6, goodput 0.83; GPU time of
#                prefill forwards 44.2 s, of decode steps 28.3. Expected: near that, if a busy server's shard forwards
#                cost their price; then TP2's gap is its all-reduces, priced 2.1 s of prefill GPU time over the replay.
#                Found at a012514 (1 x H200): TTFT p50 1,273 ms, TPOT p50 71.3, goodput 0.98; prefill GPU time 41.60 s
#                (+6.3 %), decode 28.65 (-1.1 %): the shard's forwards cost less than priced, TP2's all-reduces are not the gap
#   q30_mooncake_timer_1gpu  q30_mooncake_1gpu again with SGLang's device timer (its first run had none): GPU time by
#                forward category against the simulation's. Predicted (as above): GPU time of prefill forwards 84.2 s,
#                of decode steps 46.5; TTFT p50 6,325 ms, TPOT p50 115.1 (measured at bebe22a: 6,024, 117). Found at
#                a012514 (1 x H200): prefill 81.36 s (+3.5 %), decode 50.30 (-7.6 %); TTFT p50 5,809, TPOT p50 116
#   q8_mooncake_shard_1gpu, q8_mooncake_timer_1gpu  the two above on Qwen3-8B (dense): is a busy server's prefill over
#                long prefixes cheaper than its price on a dense model too? Predicted (planner of the commit adding
#                them): GPU time of prefill forwards 41.3 s on the shard at 1x (39.7 with the new tokens' discount held
#                past 8,192 cached), 80.8 s on TP1 at 0.5x (79.2 held); TTFT p50 1,225 and 2,432 ms (1,118 and 2,359).
#                Found at e2ce23c (1 x H200): 39.51 and 78.06 s (+4.6, +3.5 %; held +0.4, +1.5 %); TTFT p50 1,100, 2,158
#   prefix_probe_timed_1gpu  prefix_probe_shards_1gpu's trace on the TP2 shards of Qwen3-30B-A3B and Qwen3-8B again,
#                through bench.compare with SGLang's device timer: the GPU time of all the probes' prefill forwards,
#                against their TTFTs summed (5.54 and 4.93 s at cb2fe1b). The busy Mooncake replays' prefills took the
#                GPU time priced with the new tokens' discount held past 8,192 cached, while these probes' TTFTs, one
#                at a time, matched the fade. Predicted (planner of the commit adding it): 5.80 and 5.09 s with the
#                fade, 5.17 and 4.65 held. Expected: near the TTFTs if a lone request over a long radix hit takes its
#                time on the GPU; near held if the rest is outside the forwards. Found at a50e0b5 (1 x H200): 5.40 and
#                4.76 s, 98 and 97 % of the TTFTs: on the GPU; so the fade now ends at 32,768 (`steps.PREFIX_FADE_END`)
#   q32_mooncake_shard_1gpu  the Mooncake window at 0.4x on Qwen3-32B's TP2 shard alone, device timer on: a third
#                model after `steps.PREFIX_FADE_END` was fitted (its r is near 1, so the fade's end barely moves it: a
#                check of a busy server's prefill price on a large dense shard, overloaded). Predicted (planner of the
#                commit adding it): prefill GPU time 152.5 s, decode 46.4 s; TTFT p50 26,224 ms, TPOT p50 193.9. Found
#                at 19e67c1 (1 x H200): 150.56 s (+1.3 %), 53.12 (-12.6 %); TTFT p50 24,088 (+8.9 %), TPOT p50 201.9 (-4.0 %)
#   decode64_shard_1gpu  decode steps of 64 rows at 11,264 tokens of prompt on Qwen3-8B's TP2 shard alone, a fresh KV
#                pool: the longest-row step model measured -16.8 % on that shard's busy Mooncake replay at 38-66 rows of
#                about 11K (plan/README.md). Predicted (`Calibration.decode_step_ms(64, 11,264)`): 19.98 ms at the prompt's
#                context (plus 3/4 of 32 output tokens). Expected: near it if the replay's gap is its KV pool or its
#                mixed rows; 15 % over if the model is short at 64 rows. Found at 6ed32bc (1 x H200): 23.76 ms, -15.7 %:
#                the model; one KV rate per GPU kind since (2,700 GB/s, -5.6 %; plan/validate_1gpu_h200_decode64_2026-11-29/)
#   tp4_shards_azure_1gpu  the TP4 shards of Llama-3.1-70B and Qwen3-32B alone (a TP4 replica without its all-reduces),
#                device timer on, each on its `l70_shift_4gpu_h200` / `q32_shift_1.5x_4gpu_h200` burst and Azure window
#                (2x of 120 s; 1.5x of 300 s), where the planner put TP4's TPOT p50 at +10.2 % and +97.3 % and its
#                goodput at -43.7 % and -22.1 %. Predicted (planner of the commit adding it, on each shard's config):
#                Llama KV 1,216,097; burst 128 x (2,048, 32) 15,848 tok/s, TTFT p50 8,177 ms, TPOT p50 278.6; 2x
#                11,710 tok/s, TTFT p50 1,536, TPOT p50 160.7. Qwen3-32B KV 1,808,443; burst 64 x (2,048, 32) 32,040
#                tok/s, TTFT p50 1,979, TPOT p50 70.5; 1.5x 21,057 tok/s, TTFT p50 2,451, TPOT p50 471.1. Expected: within
#                10 %, as the TP2 shard of Llama was; then TP4's misses are its communication's
#                Found at 7a23ad8 (1 x H200): Llama KV 1,215,058 (+0.1 %); burst 16,576 (-4.4 %), TTFT p50 7,865
#                (+4.0 %), TPOT p50 262.3 (+6.2 %); 2x TTFT p50 1,362 (+12.8 %), TPOT p50 153.6 (+4.6 %), goodput 0.81
#                req/s (0.55 predicted, -31.9 %). Qwen3-32B KV 1,804,295 (+0.2 %); burst 32,120 (-0.2 %), 1,977 (+0.1 %),
#                69.1 (+2.0 %); 1.5x TTFT p50 2,209 (+11.0 %), TPOT p50 486.3 (-3.1 %), goodput 0.78 (+4.7 %). So TP4's
#                +97 % TPOT on Qwen3-32B is what TP4 adds in a busy replay (its burst, the same all-reduces, is within
#                2.8 %); Llama's goodput miss is mostly the shard's own, TTFT +12.8 % near the 2 s objective
#   l70_shard_azure_1gpu  Llama-3.1-70B's TP2 shard alone (one TP2 replica without its all-reduces), device timer on:
#                a burst of 64 x (2,048 in, 32 out) and `l70_shift_4gpu_h200`'s Azure code window at 1x (the load of
#                one TP2 x DP2 replica there at 2x) and 2x. There the planner put TP2 x DP2's TPOT p50 at 85.9 ms against
#                62.7 measured (+37 %) and TP4's goodput -43.7 %: is the shard's step model or the schedule short, or
#                the communication? Predicted (planner of the commit adding it, `plan_requests` on the shard's config):
#                KV 392,739; burst 8,209 tok/s, TTFT p50 7,879 ms, TPOT p50 269.4; 1x 6,253 tok/s, TTFT p50 2,829,
#                TPOT p50 287.0; 2x 6,904 tok/s, TTFT p50 5,927, TPOT p50 564.4
#                Found at 0dbe232 (1 x H200): KV 392,233 (+0.1 %); burst 8,418 (-2.5 %), TTFT p50 7,665 (+2.8 %), TPOT
#                p50 262.3 (+2.7 %); 1x TTFT p50 2,740 (+3.2 %), TPOT p50 279.9 (+2.5 %); 2x 5,569 (+6.4 %), 546.6 (+3.3 %):
#                the shard and its schedule are priced right; TP2 x DP2's miss there is what the group adds
#   decode_frag_q32_1gpu  decode steps of 64 rows at about 11K tokens on Qwen3-32B's TP2 shard alone (93 % of its KV):
#                uniform prompts of 11,264 on a fresh pool, then rows of 2,048 and 20,480 in turn (the same mean), then
#                30 s of the Mooncake window at 0.4x, which fills and evicts the pool, then the uniform rows again: the
#                busy replay of that shard (`q32_mooncake_shard_1gpu_h200`, 98 % of its KV, 66 rows) spent 11.2 % more
#                decode GPU time than the simulation, while fresh pools' uniform rows are priced within -5.6 to +6.6 %.
#                Predicted (`validate_1gpu report`, the planner prices a batch by its mean context): 48.2 ms for all
#                three. Expected: the fresh uniform step within 6 %; the mixed one slower if SGLang's triton decode
#                sizes its split of the KV by the longest row; the last slower if a freed and refilled pool reads
#                slower
#                Found at db3477f (1 x H200): 47.88 ms fresh (+0.6 %), 45.10 mixed (+6.8 %: faster than uniform), 48.23
#                after the replay (-0.1 %) and 45.14 mixed (+6.8 %); the 30 s replay itself 7,234 tok/s (+1.1 %), TTFT
#                p50 +6.4 %, TPOT p50 -2.7 %. Neither a refilled pool nor mixed rows slow a step: the busy replay's
#                11.2 % more decode GPU time is not the pool (plan/validate_1gpu_h200_decode_frag_2026-11-29/)
#   decode512_1gpu  where Shift's high-load decode loses to DP2's (at the server 0.93x: Shift's 512-row TP2 steps 21.7 ms,
#                DP2's replicas 256 rows in about 20.3, q8_graphs512_pair_2gpu_h200): on one GPU, in one call, Qwen3-8B TP1
#                (a DP2 replica, and the base configuration's compute at SP2: each GPU 256 rows through the whole weights)
#                and its TP2 shard alone (TP2 without its all-reduces), decode steps of 256 and 512 rows at 1,152 tokens
#                of prompt, graphs to 512 rows, --incremental-streaming-output (the output stream must not bound a 512-row
#                step). Predicted (`plan(decode_points=...)`, planner of the commit adding it, context 1,200): TP1 22.25 ms
#                at 256 rows, 42.28 at 512; the shard 13.77 and 21.95. Expected: the shard's 512-row step under TP2's
#                21.7 by its all-reduces (the planner's 0.6 ms), and TP1's 256-row step near DP2's 20.3; then Shift's base
#                decode at 512 rows costs TP1's 256-row step plus its exchanges: the bound on Shift's high-load ratio.
#                Found at 9589f4a (1 x H200, the client's gaps between tokens): TP1 22.05 ms at 256 rows (SGLang's log,
#                256 rows at 11,597 tok/s: 22.1), the shard 13.42 and 20.94 (-2.6 %, -4.6 %); but TP1's 512 rows 21.10,
#                under its 256 and under the 88 GB of KV such a step reads (18 ms at 4.8 TB/s) plus its GEMMs: the
#                output stream lagged the steps and caught up, so the client's gaps do not time a step there. Again as
#                decode512_log_1gpu with SGLang's --decode-log-interval 1 (`validate_1gpu` then reads every step's time
#                from the server's log, `server_step_ms`) and 384 rows too. Found at afdd77d (1 x H200, the server's
#                log): TP1 22.2, 31.0, 41.9 ms at 256, 384, 512 rows; the shard 13.6, 16.5, 22.0 (every one within -3.3 to
#                +4.3 % of its price); the client's gaps 10.6 ms at TP1's 256. So TP2's 512-row step is a DP2 replica's
#                but for its all-reduces (0.55 ms priced), and the base configuration's would be a replica's plus its
#                exchanges: Shift about 0.97x DP2 either way (plan/validate_1gpu_h200_decode512_2026-11-29/)
#   q8_stream_shard_1gpu  is the output stream's bound the host's or the burst's? Qwen3-8B's TP2 shard alone on one
#                GPU (its 512-row steps 22.0 ms: 23K tokens a second, faster than the stream), 512 x (1,024 in, 256 out)
#                at once, decode graphs to 512 rows, as SGLang streams (whole output so far a chunk), then with
#                --incremental-streaming-output (q8_stream_shard_incr_1gpu). On 2 x H200 the same burst fitted a stream
#                of about 11K tokens a second on every configuration (q8_graphs512_pair_2gpu_h200) where plan
#                calibrate's probes on one-H200 hosts measured 15.6-23.7K. Predicted (planner of the commit adding it,
#                the shard's config, graphs to 512): 52,157 tok/s, TPOT p50 36.1 ms; at 11K tokens a second (`validate
#                --stream-tokens-per-s 11000`) 35,340 and 59.6; unbound 54,231 and 34.2. Expected: near 52K if a
#                one-H200 host streams as its probes did (the 2-GPU hosts' stream is theirs); near 35K if this burst
#                streams at about 11K anywhere (then the probes miss what this burst's streams cost); with the flag
#                near 54K either way. Found at f2f200e (1 x H200): 35,854 tok/s, TPOT p50 54.6 ms; with the flag 38,727
#                and 51.2. The server decoded 512 rows at 23-25K tokens a second (5.4 s), the clients' last tokens 4-5.5 s
#                after its last step: this burst streamed at about 11-14K either way on a one-H200 host too
#   stream_probe_1gpu  where plan calibrate's stream probe and a burst's stream part: Qwen3-8B's TP2 shard alone on one GPU
#                (graphs to 512 rows), `validate_1gpu measure --stream-probes` (the tokens a second delivered while all of
#                a burst's requests decode, `calibrate.streamed_window`): 256 x (16, 128) (the probe's), 512 x (16, 128),
#                256 x (1,024, 128) and 512 x (1,024, 256) (q8_stream_shard_1gpu's burst), as SGLang streams; then the
#                last again with --incremental-streaming-output. The planner's stream rate for this model: 22,166 tokens
#                a second at every output length (the bundled probes' median). q8_stream_shard_1gpu_h200's burst
#                streamed at about 11-14K. Expected: if the probe's size is the difference, its own point near 22K and
#                the 512 x (1,024, 256) point near 11-14K, the two between them saying whether the streams' count or
#                the prompts' length costs it; if every point is near 11-14K, this host's stream is slower than the
#                bundled probes' hosts. Found at d0a9325 (1 x H200): 15,521, 14,794, 16,624 and 15,383 tokens a second;
#                16,304 with the flag: the burst's size does not move the rate, the host does (the planner's 22,166 is
#                33-50 % over; plan/validate_1gpu_h200_stream_probes_2026-11-29/)
#   stream_check_1gpu  compare --stream-probe on GPU: Qwen3-8B's TP2 shard alone, 64 x (2,048 in, 32 out), the probe after
#                the warm-up. Expected: a rate near stream_probe_1gpu's 15.5K on such a host, and the report's line.
#                Found at 061f4b3 (1 x H200): 15,940 tokens a second against the planner's 22,166, in compare.md's line
#   q8_stream_burst_1gpu  does a server's own stream probe predict its stream-bound burst? q8_stream_shard_1gpu's burst
#                (Qwen3-8B's TP2 shard alone, 512 x (1,024 in, 256 out), graphs to 512 rows, whole-output chunks) with
#                compare --stream-probe on the same server. That burst ran 35,854 tok/s (predicted 52,157 at the planner's
#                22,166 tokens a second; `validate --stream-tokens-per-s` 15,500: 43,406; 12,000: 37,331), and the next
#                host's probes delivered 14.8-16.6K. Expected: `validate --stream-from-probes` within 10 % if the probe's
#                rate is the burst's; if the burst still runs slower than its own probe, the full burst streams slower
#                than the probe's window (the prefill phase's intake, or the 512 streams' end), and a probe does not settle it.
#                Found at 5d88fdb (1 x H200, a slow host): the probe 9,672 tokens a second, the burst 33,821 tok/s, TPOT
#                p50 61.8 ms; predicted at the server's own probe -3.9 % and +6.7 % (at the bundled rate +54.2 %, -41.6 %).
#                Again as q8_stream_burst2_1gpu on the next host: a second pair of probe and burst. Found at 51c2a15
#                (1 x H200): the probe 8,995, the burst 33,795 tok/s, TPOT p50 61.9 ms; at its own probe -8.5 %, +13.0 %
#   pack         what an earlier call of the same lease left in /tmp/compare_results, as one file
set -u
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
[ $# -ge 1 ] || { echo "usage: SIDP_COMMIT=C OUT=DIR bash scripts/gpu_runs.sh RUN [RUN...] (--help lists the runs)" >&2; exit 2; }
for v in SIDP_COMMIT OUT; do
  [ -n "${!v:-}" ] || { echo "gpu_runs.sh: set $v (SIDP_COMMIT: the commit, the host has no .git; OUT: the results folder)" >&2; exit 2; }
done
export SIDP_COMMIT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s) TOTAL=${TOTAL:-570}
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
source scripts/gpu_env.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
NG=$(nvidia-smi -L | wc -l)
case "$GPU" in *H100*) TAG=h100;; *H200*) TAG=h200;; *) TAG=other;; esac
echo "GPU: $GPU x $NG, commit $SIDP_COMMIT"
X="--attention-backend triton --sampling-backend pytorch"
AZURE=.gpu/traces/AzureLLMInferenceTrace_code.csv
# two 2-GPU configurations at once on a 4-GPU host, one after the other on GPUs 0,1 of a 2-GPU host (runs that use it)
if [ "$NG" -ge 4 ]; then PAIRS="--gpus 0,1,2,3 --parallel"; else PAIRS="--gpus 0,1"; fi
resume() { [ -d ".gpu/prev/$1" ] && { mkdir -p "$OUT/$1"; cp -r ".gpu/prev/$1/." "$OUT/$1/"; chmod -R u+w "$OUT/$1"; }; true; }
compare_run() {  # compare_run NAME MODEL COMPARE_ARGS...: bench.compare into $OUT/NAME, stopped before the call's end
  local name=$1 model=$2 L; shift 2; resume "$name"; L=$(left)
  timeout -s TERM $((L - 15)) python3 -m sgl_sidp.bench.compare --model-path ".gpu/models/$model" --load-format dummy \
    --extra-args "$X" --out-dir "$OUT/$name" --deadline-s $((L - 75)) --step-grace-s 40 --ready-timeout-s 320 --no-predict "$@"
}
PROBES=.gpu/traces/prefix_probes.jsonl  # `python -m sgl_sidp.bench.traces prefix-probes` writes it here (probe_trace)
probe_trace() { mkdir -p .gpu/traces && python3 -m sgl_sidp.bench.traces prefix-probes "$PROBES"; }
probe_runs() {  # probe_runs NAME GPUS CONFIG MODEL...: the prefix-probe trace replayed on CONFIG of each model
  local name=$1 gpus=$2 config=$3 M; shift 3; probe_trace
  for M in "$@"; do compare_run "$name" "$M" --gpus "$gpus" --configs "$config" --trace "$PROBES" --rates 1; done
}
tp_shard() {  # tp_shard MODEL TP: .gpu/models/MODEL-tpTP-shard, MODEL's TP shard as a model (`plan.steps.shard_config`;
  # TP2: the committed shard configs of prefix_probe_shards_1gpu to the byte); prints its folder name
  mkdir -p ".gpu/models/$1-tp$2-shard"
  python3 -c "import json, sys; from sgl_sidp.plan.steps import ModelShapes, shard_config; from sgl_sidp.plan.configs \
import shard_of; hf = json.load(open(sys.argv[1])); tp = int(sys.argv[2]); \
print(json.dumps(shard_config(hf, shard_of(ModelShapes.of(hf), tp, tp, tp))))" ".gpu/models/$1/config.json" "$2" \
    > ".gpu/models/$1-tp$2-shard/config.json"
  echo "$1-tp$2-shard"
}
tp2_shard() { tp_shard "$1" 2; }
mooncake_window() {  # mooncake_window NAME MODEL RATE: q30_mooncake's trace window on TP1 of MODEL on GPU 0
  compare_run "$1" "$2" --gpus 0 --configs tp1 \
    --trace .gpu/traces/mooncake_head400.jsonl --rates "$3" --trace-args '--duration-s 60 --max-context-len 40960' \
    --slo-ttft-ms 2000 --slo-tpot-ms 100
}
mooncake_timed() {  # mooncake_timed NAME MODEL RATE: mooncake_window with SGLang's device timer on
  SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 mooncake_window "$@"
}
pull_cost_run() {  # pull_cost_run NAME ARGS...: bench.pull_cost on Llama-3.1-70B over every GPU into $OUT/NAME
  local d="$OUT/$1" a; shift; mkdir -p "$d"
  a="--model-path .gpu/models/Llama-3.1-70B --gpus $(seq -s, 0 $((NG - 1))) $*"
  echo "$(date -u +%FT%T) commit $SIDP_COMMIT: python -m sgl_sidp.bench.pull_cost $a" > "$d/commands.txt"
  timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.pull_cost $a --json "$d/pull_cost.json" | tee "$d/pull_cost.md"
}
for RUN in "$@"; do
  L=$(left); [ "$L" -lt 150 ] && [ "$RUN" != pack ] && { echo "skip $RUN: $L s left"; continue; }
  echo "=== $RUN ($L s left) $(date -u +%T)"
  case $RUN in
    exact4)
      OUT=$OUT timeout -s TERM $((L - 10)) bash scripts/gpu_compare_families.sh "exact_4gpu_shift_$TAG" \
        "qwen3 qwen2 llama mistral" --gpus 0,1,2,3 \
        --configs shift_sp4_tp1_th1,shift_sp4_tp1_th1_exact,shift_sp2_tp2_th1,shift_sp2_tp2_th1_exact \
        --exact --servers-per-gpu 4 --extra-args "$X --max-total-tokens 65536 --cuda-graph-max-bs 8" \
        --deadline-s $((L - 70)) --step-grace-s 40 --ready-timeout-s 300 --no-predict ;;
    q30_mooncake)
      compare_run "q30_mooncake_2gpu_$TAG" Qwen3-30B-A3B --gpus 0,1,2,3 --parallel \
        --configs tp2,zerodp_dp2_kv10262,dp2,dp2_attn --burst 64+2048+32 \
        --trace .gpu/traces/mooncake_head400.jsonl --rates 1 --trace-args '--duration-s 60 --max-context-len 40960' \
        --slo-ttft-ms 2000 --slo-tpot-ms 100 ;;
    q8_shift3x)
      compare_run "q8_shift_3x300s_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel --configs tp2,shift_sp2_tp1,dp2 \
        --burst 64+2048+32 --trace "$AZURE" --rates 3 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_overlap3x)
      compare_run "q8_overlap_3x300s_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel --configs shift_sp2_tp1_overlap,dp2,tp2 \
        --burst 64+2048+32 --trace "$AZURE" --rates 3 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q32_overlap15x)
      compare_run "q32_overlap_1.5x_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs shift_sp4_tp1_overlap,tp2_dp2 \
        --burst 64+2048+32 --trace "$AZURE" --rates 1.5 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 15 ;;
    q32_overlap15x_all)
      compare_run "q32_overlap_all_1.5x_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs shift_sp4_tp1,tp4,tp2_dp2,dp4 \
        --burst 64+2048+32 --trace "$AZURE" --rates 1.5 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 15 ;;
    q8_shift_th)
      compare_run "q8_shift_th_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel --configs tp2,shift_sp2_tp1,dp2 \
        --burst 64+2048+32 --trace "$AZURE" --rates 3 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_shift_rates)
      compare_run "q8_shift_rates_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel --configs shift_sp2_tp1,tp2,dp2 \
        --trace "$AZURE" --rates 1.5,2 --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_shift_profile2k)
      compare_run "q8_shift_profile2k_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel --configs shift_sp2_tp1,tp2 \
        --config-args "shift_sp2_tp1=--chunked-prefill-size 2048" --config-args "tp2=--chunked-prefill-size 2048" \
        --profile 96+2048+8 --profile-steps 3 ;;
    q8_par_check)
      compare_run "q8_par_check_beside_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel --configs shift_sp2_tp1,dp2 \
        --burst 64+2048+32
      compare_run "q8_par_check_alone_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1,dp2 --burst 64+2048+32 ;;
    q30_ep)
      compare_run "q30_ep_2gpu_$TAG" Qwen3-30B-A3B $PAIRS --configs dp2_attn_ep,dp2_attn --burst 256+2048+256
      compare_run "q30_ep_prefill_2gpu_$TAG" Qwen3-30B-A3B $PAIRS --configs dp2_attn_ep,dp2_attn --burst 64+8192+16 ;;
    q8_shift_chunk2x)
      case $TAG in h100) MF=0.828;; *) MF=0.902;; esac
      compare_run "q8_shift_chunk2x_2gpu_$TAG" Qwen3-8B --gpus 0,1,2,3 --parallel \
        --configs shift_sp2_tp1_th1024,shift_sp2_tp1_th1025,dp2 \
        --config-args "shift_sp2_tp1_th1025=--chunked-prefill-size 16384 --max-prefill-tokens 16384 --mem-fraction-static $MF" \
        --burst 64+2048+32 --trace "$AZURE" --rates 3 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_shift_blocks)
      compare_run "q8_shift_blocks_2gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1,dp2 --burst 64+2048+32 \
        --profile 64+2048+8 --profile-steps 3 ;;
    q8_shift_blocks3x)
      compare_run "q8_shift_blocks3x_2gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1,tp2,dp2 \
        --burst 64+2048+32 --trace "$AZURE" --rates 3 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_shift_busy)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "q8_shift_busy_2gpu_$TAG" Qwen3-8B $PAIRS \
        --configs shift_sp2_tp1,tp2 --trace "$AZURE" --rates 2 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    a2a_shift)
      mkdir -p "$OUT/a2a_shift_2gpu_$TAG"
      for M in Qwen3-8B Qwen3-32B; do
        timeout -s TERM 150 python3 -m sgl_sidp.bench.a2a --model-path ".gpu/models/$M" --tokens 2048,4096,8192,16384 \
          --gpus 2 2>&1 | tee -a "$OUT/a2a_shift_2gpu_$TAG/a2a.md"; echo >> "$OUT/a2a_shift_2gpu_$TAG/a2a.md"
      done
      [ "$NG" -ge 4 ] && timeout -s TERM 150 python3 -m sgl_sidp.bench.a2a --model-path .gpu/models/Qwen3-32B \
        --tokens 2048,4096,8192,16384 --gpus 4 2>&1 | tee -a "$OUT/a2a_shift_2gpu_$TAG/a2a.md" ;;
    exact2_shift)
      OUT=$OUT timeout -s TERM $((L - 10)) bash scripts/gpu_compare_families.sh "exact_2gpu_shift_$TAG" "qwen3 llama" \
        --gpus 0,1 --configs shift_sp2_tp1_th1_exact,shift_sp2_tp1_th1,tp2 --exact --servers-per-gpu 3 \
        --extra-args "$X --max-total-tokens 65536 --cuda-graph-max-bs 8" --deadline-s $((L - 70)) --step-grace-s 30 \
        --ready-timeout-s 200 --no-predict ;;
    overlap_graph)
      mkdir -p "$OUT/overlap_graph_$TAG"
      timeout -s TERM $(($(left) - 5)) python3 -m pytest -m gpu tests/gpu/test_shift_overlap_gpu.py -q -rA -s \
        -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/overlap_graph_$TAG/pytest.txt" ;;
    a2a_overlap)
      mkdir -p "$OUT/a2a_overlap_${NG}gpu_$TAG"
      for M in Qwen3-8B:2 Qwen3-32B:2 Qwen3-32B:4; do
        G=${M#*:}; [ "$G" -gt "$NG" ] && continue
        timeout -s TERM 150 python3 -m sgl_sidp.bench.a2a --model-path ".gpu/models/${M%:*}" --layer \
          --tokens 2048,4096,8192,16384 --gpus "$G" 2>&1 | tee -a "$OUT/a2a_overlap_${NG}gpu_$TAG/a2a.md"
        echo >> "$OUT/a2a_overlap_${NG}gpu_$TAG/a2a.md"
      done ;;
    q8_overlap)
      compare_run "q8_overlap_${NG}gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1_overlap,shift_sp2_tp1,dp2,tp2 \
        --burst 64+2048+32 --burst-twice ;;
    q32_overlap)
      compare_run "q32_overlap_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs shift_sp4_tp1_overlap,shift_sp4_tp1 \
        --burst 64+2048+32 --burst-twice
      compare_run "q32_overlap2_${NG}gpu_$TAG" Qwen3-32B $PAIRS --configs shift_sp2_tp1_overlap,dp2 \
        --burst 64+2048+32 --burst-twice ;;
    cal_q32|cal_q30|cal_l70|cal_q8|cal_q32_4|cal_mx)
      case $RUN in cal_q32) M=Qwen3-32B G=2;; cal_q30) M=Qwen3-30B-A3B G=2,4;; cal_q8) M=Qwen3-8B G=2,4;;
        cal_q32_4) M=Qwen3-32B G=2,4;; cal_mx) M=Mixtral-8x7B G=2,4;; *) M=Llama-3.1-70B G=2,4;; esac
      mkdir -p "$OUT/${RUN}_$TAG"
      SIDP_CALIBRATION_DIR="$OUT/${RUN}_$TAG" timeout -s TERM $((L - 15)) python3 -m sgl_sidp.plan calibrate \
        --model-path ".gpu/models/$M" --gpus $G > "$OUT/${RUN}_$TAG/calibrate.log" 2>&1
      tail -5 "$OUT/${RUN}_$TAG/calibrate.log" ;;
    q32_shift4)
      compare_run "q32_shift_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs tp4,shift_sp2_tp2,tp2_dp2,shift_sp4_tp1 \
        --burst 64+2048+32 --trace "$AZURE" --rates 2 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 15 ;;
    q32_shift4_15x)
      compare_run "q32_shift_1.5x_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 \
        --configs shift_sp2_tp2,tp4,tp2_dp2,dp4,shift_sp4_tp1 --burst 64+2048+32 --trace "$AZURE" --rates 1.5 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 15 ;;
    q32_shift4_15x_sp4)
      compare_run "q32_shift_1.5x_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 \
        --configs shift_sp4_tp1 --burst 64+2048+32 --trace "$AZURE" --rates 1.5 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 15 ;;
    burst_twice)
      compare_run "burst_twice_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs tp4,dp4 --burst 64+2048+32 --burst-twice ;;
    burst_intake)
      compare_run "burst_intake_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs tp4,dp4 --burst 64+2048+32 --burst-twice \
        --extra-args "$X --enable-request-time-stats-logging" ;;
    burst_profile)
      compare_run "burst_profile_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs tp4,dp4 --profile 64+2048+32 \
        --profile-at-start --profile-steps 4 --extra-args "$X --enable-request-time-stats-logging" ;;
    q30_dpattn4)
      compare_run "q30_dpattn4_4gpu_$TAG" Qwen3-30B-A3B --gpus 0,1,2,3 --configs dp4_attn --burst 256+2048+256 ;;
    overlap_off)
      compare_run "overlap_on_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs tp4 --burst 64+2048+32
      ( export SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1
        compare_run "overlap_off_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs tp4,tp2_dp2 --burst 64+2048+32 ) ;;
    q8_overlap)
      for CHUNK in 2048 8192; do
        compare_run "q8_overlap_on_ch${CHUNK}_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 --burst 64+2048+32 \
          --extra-args "$X --chunked-prefill-size $CHUNK"
        ( export SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1
          compare_run "q8_overlap_off_ch${CHUNK}_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 --burst 64+2048+32 \
            --extra-args "$X --chunked-prefill-size $CHUNK" )
      done ;;
    release_lead)
      compare_run "q8_release_ch4096_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 --burst 64+2048+32 \
        --extra-args "$X --chunked-prefill-size 4096"
      compare_run "q32_release_${NG}gpu_$TAG" Qwen3-32B --gpus 0,1 --configs tp2 --burst 64+2048+32 ;;
    shift_release)
      compare_run "q8_shift_release_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1 --burst 64+2048+32 ;;
    q30_auto2)
      compare_run "q30_auto_${NG}gpu_$TAG" Qwen3-30B-A3B --gpus 0,1 --configs auto,tp2,dp2_attn --burst 256+2048+256 ;;
    shift_twice)
      compare_run "q8_shift_twice_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1,tp2 --burst 64+2048+32 \
        --burst-twice ;;
    q8_warm)
      compare_run "q8_warm_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2,shift_sp2_tp1,dp2 --burst 64+2048+32 ;;
    q8_gap)
      compare_run "q8_gap_${NG}gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 --burst 64+2048+32 --burst-twice \
        --burst-gap-s 10 --extra-args "$X --enable-request-time-stats-logging" ;;
    l70_release)
      compare_run "l70_release_${NG}gpu_$TAG" Llama-3.1-70B --gpus 0,1 --configs tp2 --burst 64+2048+32 ;;
    q8_overlap1)
      compare_run "q8_overlap_on_${NG}gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 64+2048+32
      ( export SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1
        compare_run "q8_overlap_off_${NG}gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 64+2048+32 ) ;;
    q32_sidp512)
      compare_run "q32_sidp512_2gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --parallel --configs tp2,sidp_dp2_auto,dp2,sidp_dp2_was \
        --burst 512+2048+16 ;;
    l70_sidp512)
      compare_run "l70_sidp512_${NG}gpu_$TAG" Llama-3.1-70B --gpus 0,1,2,3 --configs sidp_dp4_auto,tp4 --burst 512+2048+16 ;;
    l70_sidp_prof)
      compare_run "l70_sidp_prof_${NG}gpu_$TAG" Llama-3.1-70B --gpus 0,1,2,3 --configs sidp_dp4_auto --profile 48+2048+8 ;;
    l70_auto512)
      compare_run "l70_auto512_${NG}gpu_$TAG" Llama-3.1-70B --gpus 0,1,2,3 --configs auto,tp2_dp2 --burst 512+2048+16 ;;
    l70_pfonly)
      compare_run "l70_pfonly_${NG}gpu_$TAG" Llama-3.1-70B --gpus 0,1,2,3 --configs sidp_dp4_was,tp2_dp2 --burst 128+4096+1 ;;
    q30_zerodp4)
      compare_run "q30_zerodp4_4gpu_$TAG" Qwen3-30B-A3B --gpus 0,1,2,3 --configs zerodp_dp4,tp2_dp2,dp4_attn,tp4 \
        --burst 256+2048+256 ;;
    q8_twice3)
      compare_run "q8_twice3_2gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1,dp2,tp2 --burst 64+2048+32 --burst-twice ;;
    q8_first_prof)
      P="--profile 64+2048+32 --profile-at-start --profile-steps 4"
      compare_run "q8_first_prof_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 $P
      compare_run "q8_second_prof_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 --burst 64+2048+32 $P ;;
    pull_cost)
      pull_cost_run "pull_cost_${NG}gpu_$TAG" --gb-per-layer 0,1.06,2.12 --reps 3 ;;
    gemm_sustained)
      D="$OUT/gemm_sustained_1gpu_$TAG"; mkdir -p "$D"
      nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 -i 0 > "$D/smi.csv" &
      SMI=$!
      for it in 20 400 20; do
        echo "$(date -u +%FT%T.%N) commit $SIDP_COMMIT: python -m sgl_sidp.bench.gemm --model-path .gpu/models/Llama-3.1-70B --tokens 8192 --gpus 1 --iters $it"
        python3 -m sgl_sidp.bench.gemm --model-path .gpu/models/Llama-3.1-70B --tokens 8192 --gpus 1 --iters $it
        echo "$(date -u +%FT%T.%N) end"; sleep 3
      done 2>&1 | tee "$D/gemm.md"
      kill $SMI ;;
    pull_gap)
      pull_cost_run "pull_gap_${NG}gpu_$TAG" --gb-per-layer 0,1.06 --gap-ms 0,1.5,3 --reps 3 ;;
    gemm_sweeps)
      D="$OUT/gemm_sweeps_1gpu_$TAG"; mkdir -p "$D"
      for m in "Llama-3.1-70B --gpus 1 --tokens 8192" "Qwen3-8B --gpus 2 --tokens 4096,8192" "Qwen3-32B --gpus 2 --tokens 4096,8192"; do
        echo "$(date -u +%FT%T) commit $SIDP_COMMIT: python -m sgl_sidp.bench.gemm --model-path .gpu/models/$m --sweeps 5"
        python3 -m sgl_sidp.bench.gemm --model-path .gpu/models/$m --sweeps 5; echo
      done 2>&1 | tee "$D/gemm.md" ;;
    q32_auto4)
      compare_run "q32_auto4_4gpu_$TAG" Qwen3-32B --gpus 0,1,2,3 --configs auto --burst 64+2048+32 ;;
    l70_tp2dp2_prof)
      compare_run "l70_tp2dp2_prof_${NG}gpu_$TAG" Llama-3.1-70B --gpus 0,1,2,3 --configs tp2_dp2 --profile 48+2048+8 ;;
    q8_shift_stats)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "q8_shift_stats_2gpu_$TAG" Qwen3-8B $PAIRS \
        --configs shift_sp2_tp1,tp2 --trace "$AZURE" --rates 3 --extra-args "$X --enable-request-time-stats-logging" \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_tp1_stats)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "q8_tp1_stats_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 \
        --trace "$AZURE" --rates 1.5 --extra-args "$X --enable-request-time-stats-logging" \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    q8_flags_1gpu)
      compare_run "q8_flags_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+1024+128
      compare_run "q8_flags_on_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+1024+128 \
        --extra-args "$X --chunked-prefill-size 4096 --cuda-graph-max-bs-decode 512" ;;
    q8_eager_prof_1gpu)
      compare_run "q8_eager_prof_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+1024+16 --profile-steps 3
      compare_run "q8_graph_prof_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+1024+16 --profile-steps 3 \
        --extra-args "$X --cuda-graph-max-bs-decode 512" ;;
    q8_eager_ctx_1gpu)
      compare_run "q8_eager_ctx128_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+128+128
      compare_run "q8_eager_ctx2048_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+2048+128 ;;
    q8_eager_host_1gpu)
      compare_run "q8_eager_host_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+1024+16 --profile-steps 3 \
        --profile-host calls
      compare_run "q8_eager_frames_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+1024+16 --profile-steps 3 \
        --profile-host frames
      compare_run "q8_eager_host128_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+128+16 --profile-steps 3 \
        --profile-host calls ;;
    q8_eager_late_1gpu)
      compare_run "q8_eager_late_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+1024+128 --profile-steps 3 \
        --profile-host calls --profile-after-s 13
      compare_run "q8_eager_late_frames_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --profile 384+1024+128 \
        --profile-steps 3 --profile-host frames --profile-after-s 13 ;;
    q8_eager_si8_1gpu)
      for si in 1 8; do
        compare_run "q8_eager_si${si}_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+1024+128 \
          --profile 384+1024+128 --profile-steps 3 --profile-host calls --profile-after-s 13 \
          --extra-args "$X --stream-interval $si"
      done ;;
    q8_intake128_1gpu)
      compare_run "q8_intake128_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+128+128 \
        --extra-args "$X --enable-request-time-stats-logging" ;;
    q8_intake_gc_1gpu)
      compare_run "q8_intake_gc_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+128+128 \
        --extra-args "$X --enable-request-time-stats-logging --gc-warning-threshold-secs 0.02" ;;
    q8_intake_frozen_1gpu)
      compare_run "q8_intake_frozen_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 384+128+128 --freeze-gc \
        --extra-args "$X --enable-request-time-stats-logging --gc-warning-threshold-secs 0.02" ;;
    q8_intake512_1gpu)
      compare_run "q8_intake512_1gpu_$TAG" Qwen3-8B --gpus 0 --configs tp1 --burst 512+1024+64 \
        --extra-args "$X --enable-request-time-stats-logging --gc-warning-threshold-secs 0.02" ;;
    q8_graphs512_shift)
      compare_run "q8_graphs512_shift_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1 --burst 512+1024+256
      compare_run "q8_graphs512_shift_on_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1 --burst 512+1024+256 \
        --extra-args "$X --cuda-graph-max-bs-decode 512" ;;
    q8_graphs512_incr_pair)
      compare_run "q8_graphs512_incr_pair_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1,dp2,shift_sp2_tp1_th256 \
        --burst 512+1024+256 --stream-probe \
        --extra-args "$X --incremental-streaming-output --decode-log-interval 1" ;;
    q8_decode_prof_pair)
      compare_run "q8_decode_prof_pair_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1_th256,dp2,shift_sp2_tp1 \
        --profile 512+1024+256 --profile-steps 3 --profile-after-s 10 ;;
    q8_decode_other_pair)
      compare_run "q8_decode_other_pair_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1,dp2 \
        --profile 512+1024+256 --profile-steps 3 --profile-after-s 10 ;;
    q8_symm_ar_pair)
      compare_run "q8_symm_ar_pair_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1,dp2 \
        --profile 512+1024+256 --profile-steps 3 --profile-after-s 10 \
        --extra-args "$X --disable-custom-all-reduce --enable-torch-symm-mem" ;;
    q8_graphs512_pair)
      compare_run "q8_graphs512_pair_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs shift_sp2_tp1,dp2 --burst 512+1024+256 ;;
    q8_graphs512)
      compare_run "q8_graphs512_on_2gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1,tp2 --burst 512+1024+256 \
        --extra-args "$X --cuda-graph-max-bs-decode 512"
      compare_run "q8_graphs512_2gpu_$TAG" Qwen3-8B $PAIRS --configs tp2,dp2 --burst 512+1024+256 ;;
    q8_shift_sp1_1gpu)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "q8_shift_sp1_1gpu_$TAG" Qwen3-8B --gpus 0 \
        --configs shift_sp1_tp1_th1024,tp1 --burst 64+2048+32 --trace "$AZURE" --rates 2 \
        --extra-args "$X --enable-request-time-stats-logging" \
        --trace-args '--duration-s 120 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "q8_shift_sp1_4x_1gpu_$TAG" Qwen3-8B --gpus 0 \
        --configs shift_sp1_tp1_th1024,tp1 --trace "$AZURE" --rates 4 --extra-args "$X --enable-request-time-stats-logging" \
        --trace-args '--duration-s 100 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 8 ;;
    long_ctx_1gpu)
      mkdir -p "$OUT/long_ctx_1gpu_$TAG"; echo "commit $SIDP_COMMIT" > "$OUT/long_ctx_1gpu_$TAG/commit.txt"
      timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.validate_1gpu measure --model-path .gpu/models/Qwen3-30B-A3B \
        --out-dir "$OUT/long_ctx_1gpu_$TAG" --ttft "" --burst "" --decode-contexts 2048,8192,16384 --decode-batches 1,16,40 \
        --extra-args "$X --json-model-override-args '{\"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 128, \"vocab_size\": 75968, \"intermediate_size\": 3072, \"moe_intermediate_size\": 384}'" ;;
    q8_shift_prof_cont)
      compare_run "q8_shift_prof_cont_2gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1,tp2 --profile 16+16384+8 \
        --profile-steps 4 ;;
    q8_shift_prof)
      compare_run "q8_shift_prof_2gpu_$TAG" Qwen3-8B $PAIRS --configs shift_sp2_tp1,tp2 --profile 128+2048+8 --profile-steps 4 ;;
    q32_burst2)
      compare_run "q32_burst2_2gpu_$TAG" Qwen3-32B $PAIRS --configs dp2,shift_sp2_tp1,tp2 --burst 64+2048+32 ;;
    q8_decode2)
      compare_run "q8_decode2_2gpu_$TAG" Qwen3-8B $PAIRS --configs dp2,shift_sp2_tp1,tp2 --burst 256+1024+512 ;;
    q8_decode2_alone)
      compare_run "q8_decode2_alone_2gpu_$TAG" Qwen3-8B --gpus 0,1 --configs tp2 --burst 256+1024+512 ;;
    prefix_probe_1gpu)
      probe_runs "prefix_probe_1gpu_$TAG" 0 tp1 Qwen3-30B-A3B Qwen3-8B Qwen3-32B ;;
    prefix_probe_shards_1gpu)
      probe_trace
      for M in Qwen3-30B-A3B Qwen3-8B Qwen3-32B; do
        case $M in
          Qwen3-30B-A3B) O='"num_attention_heads": 16, "num_key_value_heads": 2, "intermediate_size": 3072, "moe_intermediate_size": 384';;
          Qwen3-8B) O='"num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 6144';;
          Qwen3-32B) O='"num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 12800';;
        esac
        D="$OUT/prefix_probe_shards_1gpu_$TAG/$M-tp2-shard"; mkdir -p "$D"; echo "commit $SIDP_COMMIT" > "$D/commit.txt"
        [ "$(left)" -lt 200 ] && { echo "skip $M: $(left) s left"; continue; }
        timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.validate_1gpu measure --model-path ".gpu/models/$M" \
          --out-dir "$D" --ttft "" --burst "" --decode-contexts "" \
          --trace "prefix_probes=--trace $PROBES" \
          --extra-args "$X --json-model-override-args '{$O, \"head_dim\": 128, \"vocab_size\": 75968}'" | tail -3
      done ;;
    prefix_probe_2gpu)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 probe_runs "prefix_probe_2gpu_$TAG" 0,1 tp2 Qwen3-30B-A3B Qwen3-8B ;;
    q30_mooncake_1gpu)
      mooncake_window "q30_mooncake_1gpu_$TAG" Qwen3-30B-A3B 0.5 ;;
    q30_mooncake_shard_1gpu)
      mooncake_timed "q30_mooncake_shard_1gpu_$TAG" "$(tp2_shard Qwen3-30B-A3B)" 1 ;;
    q30_mooncake_timer_1gpu)
      mooncake_timed "q30_mooncake_timer_1gpu_$TAG" Qwen3-30B-A3B 0.5 ;;
    prefix_probe_timed_1gpu)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 probe_runs "prefix_probe_timed_1gpu_$TAG" 0 tp1 \
        "$(tp2_shard Qwen3-30B-A3B)" "$(tp2_shard Qwen3-8B)" ;;
    q32_mooncake_shard_1gpu)
      mooncake_timed "q32_mooncake_shard_1gpu_$TAG" "$(tp2_shard Qwen3-32B)" 0.4 ;;
    decode64_shard_1gpu)
      D="$OUT/decode64_shard_1gpu_$TAG"; mkdir -p "$D"; echo "commit $SIDP_COMMIT" > "$D/commit.txt"
      timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.validate_1gpu measure \
        --model-path ".gpu/models/$(tp2_shard Qwen3-8B)" --out-dir "$D" --ttft "" --burst "" \
        --decode-contexts 11264 --decode-batches 64 --decode-output 32 --extra-args "$X" | tail -3 ;;
    tp4_shards_azure_1gpu)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "tp4_shards_azure_1gpu_$TAG" "$(tp_shard Llama-3.1-70B 4)" \
        --gpus 0 --configs tp1 --burst 128+2048+32 --trace .gpu/traces/AzureLLMInferenceTrace_code.csv --rates 2 \
        --trace-args '--duration-s 120 --compress-gaps-s 5' --slo-ttft-ms 2000 --slo-tpot-ms 80
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "tp4_shards_azure_1gpu_$TAG" "$(tp_shard Qwen3-32B 4)" \
        --gpus 0 --configs tp1 --burst 64+2048+32 --trace .gpu/traces/AzureLLMInferenceTrace_code.csv --rates 1.5 \
        --trace-args '--duration-s 300 --compress-gaps-s 5' --slo-ttft-ms 1000 --slo-tpot-ms 15 ;;
    l70_shard_azure_1gpu)
      SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 compare_run "l70_shard_azure_1gpu_$TAG" "$(tp2_shard Llama-3.1-70B)" \
        --gpus 0 --configs tp1 --burst 64+2048+32 --trace .gpu/traces/AzureLLMInferenceTrace_code.csv --rates 1,2 \
        --trace-args '--duration-s 120 --compress-gaps-s 5' --slo-ttft-ms 2000 --slo-tpot-ms 80 ;;
    decode_frag_q32_1gpu)
      D="$OUT/decode_frag_q32_1gpu_$TAG"; mkdir -p "$D"; echo "commit $SIDP_COMMIT" > "$D/commit.txt"
      timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.validate_1gpu measure \
        --model-path ".gpu/models/$(tp2_shard Qwen3-32B)" --out-dir "$D" --ttft "" --burst "" \
        --decode-contexts 11264,2048/20480 --decode-batches 64 --decode-output 32 --decode-after-traces \
        --trace "mooncake_30s=--trace .gpu/traces/mooncake_head400.jsonl --duration-s 30 --time-scale 2.5 --max-context-len 40960" \
        --extra-args "$X" | tail -3 ;;
    q8_mooncake_shard_1gpu)
      mooncake_timed "q8_mooncake_shard_1gpu_$TAG" "$(tp2_shard Qwen3-8B)" 1 ;;
    q8_mooncake_timer_1gpu)
      mooncake_timed "q8_mooncake_timer_1gpu_$TAG" Qwen3-8B 0.5 ;;
    decode512_1gpu|decode512_log_1gpu)
      B=256,512 F=""; [ "$RUN" = decode512_log_1gpu ] && B=256,384,512 F="--decode-log-interval 1"
      for M in Qwen3-8B "$(tp2_shard Qwen3-8B)"; do
        D="$OUT/${RUN%_1gpu}_1gpu_$TAG/$M"; mkdir -p "$D"; echo "commit $SIDP_COMMIT" > "$D/commit.txt"
        timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.validate_1gpu measure --model-path ".gpu/models/$M" \
          --out-dir "$D" --ttft "" --burst "" --decode-contexts 1152 --decode-batches $B --decode-output 64 \
          --extra-args "$X --incremental-streaming-output --cuda-graph-max-bs-decode 512 $F" | tail -3
      done ;;
    q8_stream_shard_1gpu)
      S=$(tp2_shard Qwen3-8B)
      compare_run "q8_stream_shard_1gpu_$TAG" "$S" --gpus 0 --configs tp1 --burst 512+1024+256 \
        --extra-args "$X --cuda-graph-max-bs-decode 512"
      compare_run "q8_stream_shard_incr_1gpu_$TAG" "$S" --gpus 0 --configs tp1 --burst 512+1024+256 \
        --extra-args "$X --cuda-graph-max-bs-decode 512 --incremental-streaming-output" ;;
    stream_probe_1gpu)
      S=$(tp2_shard Qwen3-8B)
      for F in "" --incremental-streaming-output; do
        D="$OUT/stream_probe${F:+_incr}_1gpu_$TAG"; mkdir -p "$D"; echo "commit $SIDP_COMMIT" > "$D/commit.txt"
        P=256+16+128,512+16+128,256+1024+128,512+1024+256; [ -n "$F" ] && P=512+1024+256
        timeout -s TERM $(($(left) - 10)) python3 -m sgl_sidp.bench.validate_1gpu measure --model-path ".gpu/models/$S" \
          --out-dir "$D" --ttft "" --burst "" --decode-contexts "" --stream-probes $P \
          --extra-args "$X --cuda-graph-max-bs-decode 512 $F" | grep -A8 '"stream"'
      done ;;
    stream_check_1gpu)
      compare_run "stream_check_1gpu_$TAG" "$(tp2_shard Qwen3-8B)" --gpus 0 --configs tp1 --burst 64+2048+32 --stream-probe ;;
    q8_stream_burst_1gpu|q8_stream_burst2_1gpu)
      compare_run "${RUN%_1gpu}_1gpu_$TAG" "$(tp2_shard Qwen3-8B)" --gpus 0 --configs tp1 --burst 512+1024+256 \
        --stream-probe --extra-args "$X --cuda-graph-max-bs-decode 512" ;;
    pack)
      [ -d /tmp/compare_results ] && tar czf "$OUT/compare_results.tgz" -C /tmp compare_results ;;
    *) echo "unknown run $RUN (--help lists them)" ;;
  esac
done
find "$OUT" -name latency_vs_arrival.png -delete  # not kept in benchmarks/results/multi_gpu (README there)
for d in "$OUT"/*/; do [ -d "$d" ] && tar czf "${d%/}.tgz" -C "$OUT" "$(basename "$d")"; done
echo "=== done $(date -u +%T), $(left) s of $TOTAL left"
