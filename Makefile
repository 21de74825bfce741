# The two commands the README promises: `make demo` and `make test`, on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CKPT := $(VENV)/bin/ckpt
STAMP := $(VENV)/.installed
DEMO := demo_runs/exp7
S3PORT := 9055
S3CKPT := AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo $(CKPT) --s3-endpoint http://127.0.0.1:$(S3PORT)

.PHONY: demo test check lint types pytest browser docs docs-check docs-reference fixtures fixtures-matrix bench clean schemas

$(STAMP): pyproject.toml ckpt_cli/_kernels.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO) $(DEMO)-trend.html $(DEMO)-rec $(DEMO)-4x2 $(DEMO)-wide $(DEMO)-4x2-w2 $(DEMO)-4x2-dask $(DEMO)-copy
	@echo "== ckpt --help: every command, listed from the one registry (commands/__init__.py)"
	$(CKPT) --help
	@echo "== a usage error is one line on stderr, exit 2"
	$(CKPT) ls --bogus; echo "exit $$?"
	@echo "== train 300 steps (saves every 100, keeps 3)"
	$(PY) examples/train_mlp.py --workdir $(DEMO) --steps 300
	@echo "== train again to 600: resumes from the latest step"
	$(PY) examples/train_mlp.py --workdir $(DEMO) --steps 600
	@echo "== ckpt ls"
	$(CKPT) ls $(DEMO)
	@echo "== ckpt ls in a 60-column terminal: columns that do not fit go below each step, none dropped"
	script -qec "stty cols 60 rows 40; $(CKPT) ls $(DEMO)" /dev/null
	@echo "== ckpt inspect (latest step)"
	$(CKPT) inspect $(DEMO)
	@echo "== ckpt inspect --step 500 --filter 'params.*' --stats --flat"
	$(CKPT) inspect $(DEMO) --step 500 --filter 'params.*' --stats --flat
	@echo "== ckpt inspect --json (first lines)"
	$(CKPT) inspect $(DEMO) --json | $(PY) -m json.tool | head -n 30
	@echo "== ckpt du: where the bytes go, per step, then the largest leaves of the latest step"
	$(CKPT) du $(DEMO)
	$(CKPT) du $(DEMO)/600 --by leaf --top 5
	$(CKPT) du $(DEMO) --deep
	@echo "== ckpt du on a root with unfinished saves: the garbage, and the command that reclaims it"
	$(CKPT) du fixtures/ckpts/with_tmp
	@echo "== ckpt trend: did the run train? per leaf norms and update ratios over the steps, findings first"
	$(CKPT) trend $(DEMO) --html $(DEMO)-trend.html
	@echo "   (the same as one page: $(DEMO)-trend.html)"
	@echo "== ckpt trend on 2 worker processes (--force-split: this run is too small to pay for them): the same rows and findings, to the bit"
	$(CKPT) trend $(DEMO) --json > demo_runs/trend-1.json
	$(CKPT) trend $(DEMO) --workers 2 --force-split --unit-bytes 4KiB --json > demo_runs/trend-w2.json
	$(PY) -c "import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); print('scale:', b['scale']); a.pop('scale'); b.pop('scale'); print('the same document as one process') if a == b else sys.exit('trend --workers 2 differs')" demo_runs/trend-1.json demo_runs/trend-w2.json
	@echo "== a run that diverged (real Orbax saves; NaN from step 5): trend's verdict, verify --deep one block per leaf, a writer refuses NaN (exit 3), prune warns and keeps the last finite steps"
	$(CKPT) trend fixtures/diverged/linen | grep -E '^(trend|findings|diverged|metric)'
	$(CKPT) verify fixtures/diverged/linen --deep | tail -n 5
	$(CKPT) export fixtures/diverged/linen demo_runs/diverged-export --step 6; echo "exit $$?"
	$(CKPT) prune fixtures/diverged/linen --keep-last 2 --dry-run
	$(CKPT) prune fixtures/diverged/linen --keep-last-finite 2 --dry-run
	@echo "== a sharded checkpoint: which device holds which block"
	$(CKPT) inspect fixtures/ckpts/sharded_4x2 --layout params.w
	@echo "== checkpoints of other Orbax releases: a root of 0.4.3 (steps without step metadata), a Composite save of 0.12.8 (state + JSON + ArraySave)"
	$(CKPT) ls fixtures/matrix/0.4.3/linen_trainstate/ckpt
	$(CKPT) inspect fixtures/matrix/0.12.8/composite/ckpt --flat
	$(CKPT) diff fixtures/matrix/0.4.3/composite/ckpt@1:arr fixtures/matrix/0.12.8/composite/ckpt@1:arr
	@echo "== Orbax 0.12's newest states, from saves and deletions killed inside Orbax's own code: a commit-file run (steps 3, 4 never finished), why each is not committed, what prune keeps"
	$(CKPT) ls fixtures/orbax012/states/commit_file
	$(CKPT) prune fixtures/orbax012/states/commit_file --keep-last 1 --dry-run
	@echo "   a deletion in progress (step 2: the optimizer item being deleted; step 4: what a stopped step deletion left) and v1 partial saves"
	$(CKPT) ls fixtures/orbax012/states/deletion
	$(CKPT) ls fixtures/orbax012/states/partial
	@echo "== a flax.nnx step of three items (model, optimizer, and grain's data_iter): one item's tree, the step's training state"
	rm -rf demo_runs/nnx
	$(PY) examples/nnx_step.py demo_runs/nnx
	$(CKPT) inspect demo_runs/nnx --item model
	@echo "== checkpoints frameworks write themselves (docs/how-to/frameworks.md): a Kauldron run's no-op ds_iter item is an empty item, carried as it is"
	$(CKPT) ls fixtures/frameworks/kauldron/checkpoints
	$(CKPT) inspect fixtures/frameworks/kauldron/checkpoints --step 4 --item ds_iter
	@echo "== Keras 3's OrbaxCheckpoint: pytree beside model_config, a tree of one string with no OCDBT database (Orbax writes none): verify is clean"
	$(CKPT) inspect fixtures/frameworks/keras/epochs --item model_config | cut -c1-100
	$(CKPT) verify fixtures/frameworks/keras/epochs --deep
	@echo "== export records the item and step; import writes them back (pytree, the name Keras loads), no flag needed"
	rm -rf demo_runs/keras-export demo_runs/keras-back
	$(CKPT) export fixtures/frameworks/keras/epochs demo_runs/keras-export --item pytree
	$(CKPT) import demo_runs/keras-export demo_runs/keras-back
	ls demo_runs/keras-back/*/
	@echo "== MaxText's own training run (item 'items', typed PRNG keys), the Orbax v1 API's Checkpointer (state + metrics), a step saved on a TPU chip (one chunk per array)"
	$(CKPT) ls fixtures/frameworks/maxtext/ckpt
	$(CKPT) ls fixtures/frameworks/orbax_v1/training
	$(CKPT) verify fixtures/frameworks/tpu/run --deep
	grep -E '^\{"root"' fixtures/frameworks/tpu/device_log.txt
	@echo "== ckpt verify --record: a deep pass, then digests stored in every item"
	$(CKPT) verify $(DEMO) --record
	@echo "== ckpt verify --deep: every chunk decoded and checked against the recorded digests"
	$(CKPT) verify $(DEMO) --deep
	@echo "== digests taken while the trainer saves (examples/train_mlp.py --digests: ckpt_cli.orbax.DigestingCheckpointManager): verify --deep checks them with no --record pass"
	rm -rf $(DEMO)-rec
	$(PY) examples/train_mlp.py --workdir $(DEMO)-rec --steps 200 --digests
	$(CKPT) verify $(DEMO)-rec --deep
	@echo "== the same digests from Python (ckpt_cli.digest), and a byte flipped after the save: caught (exit 1)"
	$(PY) -c "import ckpt_cli; d = ckpt_cli.digest('$(DEMO)-rec', step=200).digests(); print(len(d), 'leaves;', next(iter(d.items())))"
	$(PY) -c "import pathlib; f = max((p for p in pathlib.Path('$(DEMO)-rec/200').rglob('d/*') if p.is_file()), key=lambda p: p.stat().st_size); b = bytearray(f.read_bytes()); b[len(b) // 2] ^= 1; f.write_bytes(bytes(b))"
	$(CKPT) verify $(DEMO)-rec --step 200 --deep; echo "exit $$?"
	@echo "== ckpt verify --latest --sample 25% --seed 1 --json (a nightly partial check)"
	$(CKPT) verify $(DEMO) --latest --sample 25% --seed 1 --json | $(PY) -m json.tool | head -n 30
	@echo "== ckpt diff: what changed between two steps (exit 1: they differ)"
	$(CKPT) diff $(DEMO)@500 $(DEMO)@600 --filter 'params.*' || true
	@echo "== Ctrl-C in the middle of verify --deep (a 256 MiB leaf, sent once it is reading it): exit 130, no verdict on unread data"
	test -d demo_runs/big || $(PY) tests/support/make_big.py demo_runs/big 256
	$(PY) tests/support/interrupts.py INT verify demo_runs/big --deep
	@echo "== the same with SIGTERM, as timeout and schedulers stop jobs: exit 143"
	$(PY) tests/support/interrupts.py TERM verify demo_runs/big --deep
	@echo "== a byte flipped in a data file: only the recorded digests see it"
	$(CKPT) verify fixtures/damaged/flipped-byte || true
	$(CKPT) verify fixtures/damaged/flipped-byte --deep || true
	@echo "== ckpt reshard for a (data=4, model=2) mesh, then restore it on 8 CPU devices"
	rm -rf $(DEMO)-4x2
	$(CKPT) reshard $(DEMO) $(DEMO)-4x2 --mesh data=4,model=2 --rules examples/mesh_4x2.yaml
	@echo "== the resharded step holds the same values and carries the recorded digests"
	$(CKPT) diff $(DEMO) $(DEMO)-4x2
	$(CKPT) verify $(DEMO)-4x2 --deep
	$(CKPT) inspect $(DEMO)-4x2 --layout params.Dense_0.kernel
	$(PY) examples/restore_on_mesh.py $(DEMO)-4x2
	@echo "== ckpt digest: every leaf's ld1 digest (dtype, shape, values): the same on the 4x2 mesh as on one device"
	$(CKPT) digest $(DEMO) > demo_runs/digests-1x1.txt
	$(CKPT) digest $(DEMO)-4x2 > demo_runs/digests-4x2.txt
	head -n 4 demo_runs/digests-4x2.txt
	diff demo_runs/digests-1x1.txt demo_runs/digests-4x2.txt && echo "the same $$(wc -l < demo_runs/digests-4x2.txt) digests"
	@echo "== scale out: with --workers 2 this small checkpoint stays in one process (the start-up would not pay; it says why), --force-split splits it into units on a Dask cluster"
	rm -rf $(DEMO)-4x2-w2 $(DEMO)-4x2-dask
	$(CKPT) reshard $(DEMO) $(DEMO)-4x2-w2 --mesh data=4,model=2 --rules examples/mesh_4x2.yaml --workers 2 --unit-bytes 4KiB
	$(CKPT) diff $(DEMO)-4x2 $(DEMO)-4x2-w2
	$(PY) examples/with_dask_cluster.py $(CKPT) reshard $(DEMO) $(DEMO)-4x2-dask --mesh data=4,model=2 --rules examples/mesh_4x2.yaml --executor dask --unit-bytes 4KiB --force-split
	$(CKPT) diff $(DEMO)-4x2 $(DEMO)-4x2-dask
	$(PY) examples/with_dask_cluster.py $(CKPT) verify $(DEMO) --deep --executor dask
	@echo "== ckpt doctor: does the latest step restore into the wide model (hidden 128)? why not, and the spec that fixes it (exit 1: not as is)"
	$(CKPT) doctor $(DEMO) --target examples.train_mlp:abstract_state --write-spec $(DEMO)-fix.yaml; echo "exit $$?"
	head -8 $(DEMO)-fix.yaml
	@echo "== ckpt migrate --dry-run: widen the hidden layer 64 -> 128, checked against the wide model"
	rm -rf $(DEMO)-wide
	$(CKPT) migrate $(DEMO) $(DEMO)-wide --spec examples/widen_64_to_128.yaml --target examples.train_mlp:abstract_state --dry-run
	@echo "== ckpt migrate: write the wide step 600 (Adam moments follow), then resume training the wide model"
	$(CKPT) migrate $(DEMO) $(DEMO)-wide --spec examples/widen_64_to_128.yaml --target examples.train_mlp:abstract_state
	@echo "== the leaves no rule touched are bit-identical"
	$(CKPT) diff $(DEMO)@600 $(DEMO)-wide@600 --filter '^(params.Dense_1.bias|opt_state.0.count|rng|step)$$'
	$(PY) examples/train_mlp.py --workdir $(DEMO)-wide --hidden 128 --steps 700
	$(CKPT) ls $(DEMO)-wide
	@echo "== ckpt migrate --dry-run on a mixed-precision state: the float32 master copy and the EMA follow a rename and a widening of params; the cast to float16 leaves them float32"
	rm -rf $(DEMO)-mixed $(DEMO)-mixed-wide
	$(PY) examples/mixed_precision.py --workdir $(DEMO)-mixed --steps 3
	$(CKPT) migrate $(DEMO)-mixed $(DEMO)-mixed-wide --spec examples/rename_and_widen_mixed.yaml --target examples.mixed_precision:abstract_wide --dry-run
	@echo "== a Flax NNX model + optimizer saved as two items of one step: reshard and migrate rewrite both, Adam's moments following the model item's parameters; diff compares item by item"
	rm -rf $(DEMO)-nnx $(DEMO)-nnx-2x4 $(DEMO)-nnx-wide
	$(PY) examples/nnx_model_optimizer.py --workdir $(DEMO)-nnx
	$(CKPT) reshard $(DEMO)-nnx $(DEMO)-nnx-2x4 --mesh data=2,model=4 --rule 'linear.kernel.*=[null, model]'
	$(CKPT) diff $(DEMO)-nnx $(DEMO)-nnx-2x4 --structure --filter 'kernel' || true
	$(CKPT) migrate $(DEMO)-nnx $(DEMO)-nnx-wide --spec examples/nnx_widen_16_to_24.yaml --dry-run
	@echo "== ckpt average: steps 400 500 600 averaged into a new step 600 (parameters: the mean; Adam moments, step and rng: step 600's), streamed; then it resumes training"
	rm -rf $(DEMO)-avg
	$(CKPT) average $(DEMO) $(DEMO)-avg --steps 400,500,600
	$(CKPT) diff $(DEMO)@600 $(DEMO)-avg@600 --filter '^(opt_state.*|rng|step)$$'
	$(PY) examples/train_mlp.py --workdir $(DEMO)-avg --steps 700
	$(CKPT) ls $(DEMO)-avg
	@echo "== ckpt average --ema --optimizer drop --dry-run: the EMA's weights per step, the optimizer state left out"
	$(CKPT) average $(DEMO) $(DEMO)-ema --steps 400,500,600 --ema 0.9 --optimizer drop --dry-run
	@echo "== ckpt export: step 600 to PyTorch nn.Linear names and layout (safetensors), streamed"
	rm -rf $(DEMO)-pt $(DEMO)-back $(DEMO)-pt-bad.safetensors $(DEMO)-rank40.safetensors $(DEMO)-bad $(DEMO)-llama $(DEMO)-llama-hf $(DEMO)-llama-back
	$(CKPT) export $(DEMO) $(DEMO)-pt --step 600 --spec examples/mlp_to_pytorch.yaml
	@echo "== --threads: export decodes, hashes and writes on every core (tensors of large chunks each on a thread of their own); the same bytes at 1 thread and at all of them"
	rm -rf $(DEMO)-pt1
	$(CKPT) export $(DEMO) $(DEMO)-pt1 --step 600 --spec examples/mlp_to_pytorch.yaml --threads 1 > /dev/null
	cmp $(DEMO)-pt/model.safetensors $(DEMO)-pt1/model.safetensors && echo "identical at --threads 1 and at the default (every CPU this process may use)"
	@echo "== the safetensors library loads it"
	$(PY) -c "import safetensors.numpy as s; t = s.load_file('$(DEMO)-pt/model.safetensors'); print({k: (str(v.dtype), v.shape) for k, v in sorted(t.items())})"
	@echo "== ckpt import: back into an Orbax step 600; ckpt diff: the parameters are equal"
	$(CKPT) import $(DEMO)-pt $(DEMO)-back --spec examples/pytorch_to_mlp.yaml --step 600
	$(CKPT) diff $(DEMO)@600 $(DEMO)-back@600 --filter 'params.*'
	@echo "== the whole training state there and back: its tuples and EmptyState ride along (ckpt.tree); training resumes from the import"
	rm -rf $(DEMO)-state $(DEMO)-resumed
	$(CKPT) export $(DEMO) $(DEMO)-state --step 600
	$(CKPT) import $(DEMO)-state $(DEMO)-resumed --step 600
	$(PY) examples/train_mlp.py --workdir $(DEMO)-resumed --steps 650 --save-every 50
	@echo "== a scanned Llama-shaped Flax model to Hugging Face Llama names (sharded), and back"
	$(PY) examples/llama_tree.py --workdir $(DEMO)-llama
	$(CKPT) export $(DEMO)-llama $(DEMO)-llama-hf --spec examples/llama_to_hf.yaml --dtype bfloat16 --dry-run
	$(CKPT) export $(DEMO)-llama $(DEMO)-llama-hf --spec examples/llama_to_hf.yaml --max-shard-size 40KB --json | $(PY) -c "import json, sys; d = json.load(sys.stdin); print(d['index'], [f['name'] for f in d['files']])"
	$(CKPT) import $(DEMO)-llama-hf $(DEMO)-llama-back --spec examples/hf_to_llama.yaml --target examples.llama_tree:abstract_state
	$(CKPT) diff $(DEMO)-llama $(DEMO)-llama-back
	@echo "== weight parity: the Orbax run against its Hugging Face export, through the same spec (exit 0); then a copy with one value moved by 1e-3 (exit 1, the tensor named with its max abs error)"
	$(CKPT) diff $(DEMO)-llama $(DEMO)-llama-hf --spec examples/llama_to_hf.yaml
	rm -rf $(DEMO)-llama-hf-bad && cp -r $(DEMO)-llama-hf $(DEMO)-llama-hf-bad
	$(PY) -c "import glob, safetensors.numpy as s; f = sorted(glob.glob('$(DEMO)-llama-hf-bad/*.safetensors'))[0]; t = s.load_file(f); k = sorted(t)[0]; t[k].flat[0] += 1e-3; s.save_file(t, f, metadata={'format': 'pt'}); print('moved', k, 'by 1e-3')"
	$(CKPT) diff $(DEMO)-llama $(DEMO)-llama-hf-bad --spec examples/llama_to_hf.yaml; echo "exit $$?"
	$(CKPT) diff $(DEMO)-llama $(DEMO)-llama-hf-bad --spec examples/llama_to_hf.yaml --atol 1e-2 --json | $(PY) -c "import json, sys; d = json.load(sys.stdin); print('--atol 1e-2:', 'equal' if d['ok'] else 'different', d['summary']['equal'], 'tensors')"
	@echo "== a truncated safetensors file: one line, exit 3, nothing written"
	$(PY) -c "b = open('$(DEMO)-pt/model.safetensors', 'rb').read(); open('$(DEMO)-pt-bad.safetensors', 'wb').write(b[:-5])"
	$(CKPT) import $(DEMO)-pt-bad.safetensors $(DEMO)-bad || true
	@echo "== a hostile header (a shape of 40 dimensions): refused before anything is allocated, one line naming the field, exit 3"
	$(PY) -c "import json, struct; h = json.dumps({'x': {'dtype': 'F32', 'shape': [1] * 40, 'data_offsets': [0, 4]}}).encode(); open('$(DEMO)-rank40.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + bytes(4))"
	$(CKPT) import $(DEMO)-rank40.safetensors $(DEMO)-bad || true
	@echo "== safetensors as a source: inspect and verify a Hugging Face folder (--deep reads every tensor: NaN/Inf, the ld1 digests export recorded)"
	$(CKPT) inspect $(DEMO)-llama-hf --filter 'layers.0.self_attn'
	$(CKPT) verify $(DEMO)-llama-hf --deep
	@echo "== a value changed by 1e-3 after export: --deep names the tensor, exit 1; the truncated file and the hostile header: exit 1, each problem named"
	rm -rf $(DEMO)-pt-changed && cp -r $(DEMO)-pt $(DEMO)-pt-changed
	$(PY) -c "import json, struct, numpy as np; p = '$(DEMO)-pt-changed/model.safetensors'; b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; o = 8 + n + json.loads(b[8:8 + n])['layers.0.weight']['data_offsets'][0]; b[o:o + 4] = (np.frombuffer(bytes(b[o:o + 4]), np.float32) + np.float32(1e-3)).tobytes(); open(p, 'wb').write(bytes(b))"
	$(CKPT) verify $(DEMO)-pt-changed --deep || true
	$(CKPT) verify $(DEMO)-pt-bad.safetensors || true
	$(CKPT) verify $(DEMO)-rank40.safetensors --json | $(PY) -c "import json, sys; d = json.load(sys.stdin); print(d['ok'], [(p['code'], p['file']) for p in d['problems']])" || true
	@echo "== ckpt prune --dry-run: the plan (keep with reasons, delete with sizes); nothing changes"
	$(CKPT) prune $(DEMO) --keep-last 1 --keep-every 500 --dry-run
	@echo "== ckpt prune --yes: delete what no rule keeps (step 400)"
	$(CKPT) prune $(DEMO) --keep-last 1 --keep-every 500 --yes
	$(CKPT) ls $(DEMO)
	$(PY) -c "import orbax.checkpoint as ocp; print('orbax sees steps', ocp.CheckpointManager('$(DEMO)').all_steps())"
	@echo "== ckpt pin: prune keeps a pinned step whatever the rules, and says why; Orbax ignores the pin"
	$(CKPT) pin $(DEMO) 500 --note "best eval so far"
	$(CKPT) ls $(DEMO)
	$(CKPT) prune $(DEMO) --keep-last 1 --dry-run
	$(CKPT) unpin $(DEMO) 500
	@echo "== a nightly budget: --max-duration with --rotate (state next to the digests), or the n-th of t subsets"
	$(CKPT) verify $(DEMO) --latest --deep --max-duration 10s --rotate
	$(CKPT) verify $(DEMO) --latest --sample 2/3
	@echo "== --json on an error: one document on stdout, same exit code (3)"
	$(CKPT) verify demo_runs/no-such-run --json || true
	@echo "== object storage: an S3 server on 127.0.0.1 (SeaweedFS), bucket 'demo'"
	$(PY) examples/local_s3.py stop demo_runs/s3.pid
	$(PY) examples/local_s3.py start $(S3PORT) demo demo_runs/s3.pid
	@echo "== ckpt reshard: a local checkpoint into the bucket (written in place, commit_success.txt last)"
	$(S3CKPT) reshard $(DEMO) s3://demo/exp7-4x2 --mesh data=4,model=2 --rules examples/mesh_4x2.yaml
	$(S3CKPT) ls s3://demo/exp7-4x2
	$(S3CKPT) inspect s3://demo/exp7-4x2 --layout params.Dense_0.kernel
	$(S3CKPT) verify s3://demo/exp7-4x2 --deep
	$(S3CKPT) diff $(DEMO) s3://demo/exp7-4x2
	@echo "== ckpt cp: the run into the bucket (data first, commit markers last, checked against the recorded digests), and back"
	$(S3CKPT) cp $(DEMO) s3://demo/exp7-copy --verify
	$(S3CKPT) ls s3://demo/exp7-copy
	@echo "== ls -v: how the bucket was listed (parallel ranges proven complete, or one plain listing) and open multipart uploads"
	$(S3CKPT) ls -v s3://demo/exp7-copy
	@echo "== ckpt du on the bucket: the steps' first reads in one wave, each step decoded as its reads arrive"
	$(S3CKPT) du s3://demo/exp7-copy
	$(S3CKPT) cp s3://demo/exp7-copy $(DEMO)-copy
	diff -r -x _CKPT_VERIFY_STATE.json $(DEMO) $(DEMO)-copy && echo "the copy back is byte-identical"
	@echo "== a directory of saves as the Flax NNX guide makes them (ckpt_dir/state, ckpt_dir/other): ls says each save's kind, cp copies it save by save"
	rm -rf demo_runs/ckpt_dir demo_runs/ckpt_dir-back
	$(PY) -c "import pathlib, jax.numpy as jnp, orbax.checkpoint as ocp; from flax import nnx; d = pathlib.Path('demo_runs/ckpt_dir').absolute(); c = ocp.StandardCheckpointer(); c.save(d / 'state', nnx.split(nnx.Linear(3, 4, rngs=nnx.Rngs(0)))[1]); c.save(d / 'other', {'a': jnp.ones(3)}); c.wait_until_finished()"
	$(CKPT) ls demo_runs/ckpt_dir --json | $(PY) -c "import json, sys; print([(s['name'], s['kind'], s['step']) for s in json.load(sys.stdin)['steps']])"
	$(S3CKPT) cp demo_runs/ckpt_dir s3://demo/ckpt_dir
	$(S3CKPT) ls s3://demo/ckpt_dir
	$(S3CKPT) cp s3://demo/ckpt_dir demo_runs/ckpt_dir-back
	@echo "== the same cp again: every file is already there (size, and the bucket's ETag against the source's bytes: nothing read back), nothing is written"
	$(S3CKPT) cp $(DEMO) s3://demo/exp7-copy
	@echo "== a root copied into the bucket without its commit markers (Orbax issue #394)"
	AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo $(PY) -c "import pathlib, botocore.session as s; c = s.get_session().create_client('s3', endpoint_url='http://127.0.0.1:$(S3PORT)', region_name='us-east-1'); [c.put_object(Bucket='demo', Key='exp7/' + str(p.relative_to('$(DEMO)')), Body=p.read_bytes()) for p in pathlib.Path('$(DEMO)').rglob('*') if p.is_file() and p.name != 'commit_success.txt']"
	$(S3CKPT) ls s3://demo/exp7 || true
	$(S3CKPT) verify s3://demo/exp7 --step 600 --mark-committed
	$(S3CKPT) verify s3://demo/exp7 --step 500 --mark-committed
	$(S3CKPT) ls s3://demo/exp7
	@echo "== ckpt prune in the bucket: marker first, then the objects"
	$(S3CKPT) prune s3://demo/exp7 --keep-last 1 --yes
	$(S3CKPT) ls s3://demo/exp7
	@echo "== a dead endpoint: one line, exit 3, in a few seconds"
	AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo $(CKPT) --s3-endpoint http://127.0.0.1:9 ls s3://demo/exp7 || true
	$(PY) examples/local_s3.py stop demo_runs/s3.pid

test: lint types docs-check pytest

# The fast loop while developing (under two minutes): lint, format, types, the strict docs build, the non-slow tests.
check: lint types docs-check
	$(VENV)/bin/pytest -n 2 -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check ckpt_cli tests bench examples fixtures/make_fixtures.py fixtures/make_damaged.py docs/gen_reference.py docs/gen_lists.py docs/hooks.py docs/gen_trend_page.py
	$(VENV)/bin/ruff format --check ckpt_cli tests docs/gen_reference.py docs/gen_lists.py docs/hooks.py docs/gen_trend_page.py

types: $(STAMP)
	$(VENV)/bin/mypy

# ckpt_cli compiled first: the tests start ckpt in thousands of processes, and where
# PYTHONDONTWRITEBYTECODE is set (this CI's machines) each would compile every module it imports
# again (0.24 -> 0.17 s for `ckpt inspect`); an installed wheel is compiled by pip.
# --dist loadgroup: the tests sharing a costly fixture (a module-scoped Orbax save, a training run,
# the wheel) run on one worker, scheduled first (tests/conftest.py, xdist_groups); --durations:
# the slowest tests, where to look when the run grows.
pytest: $(STAMP) browser
	$(PY) -m compileall -q ckpt_cli tests/support > /dev/null
	$(VENV)/bin/pytest -n 3 --dist loadgroup -q --durations=20

# The browser the tests open ckpt trend's page in (tests/commands/test_trend_browser.py):
# Debian's chromium, installed when missing (about 25 s here, apt-get update included); as root,
# or through sudo.
browser:
	@command -v chromium > /dev/null || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium > /dev/null; }
	@chromium --version

# The documentation site (mkdocs.yml, docs/): `make docs` builds it into site/; `docs-check`, part of
# `make test`, builds it strictly into a temporary directory (a broken link or anchor fails) and
# checks that docs/reference/ and the command lists of README.md, docs/index.md and json.md match
# the registry; `docs-reference` rewrites them.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict
	@echo "built site/: open site/index.html"

docs-check: $(STAMP)
	$(PY) docs/gen_reference.py --check
	@tmp=$$(mktemp -d); if $(VENV)/bin/mkdocs build --strict --site-dir $$tmp/site > $$tmp/log 2>&1; then rm -rf $$tmp; echo 'mkdocs build --strict: ok'; else grep -v '^INFO' $$tmp/log; rm -rf $$tmp; exit 1; fi

docs-reference: $(STAMP)
	$(PY) docs/gen_reference.py

# The published JSON Schemas of every command's --json (docs/schemas/), generated from the
# result types; refuses a changed schema under a schema_version already published.
schemas: $(STAMP)
	$(PY) -m ckpt_cli.commands._schemas docs/schemas

fixtures: $(STAMP)
	$(PY) fixtures/make_fixtures.py

# The fixture matrix: one venv per Orbax release (/work/venvs, outside the repo), run by hand.
# make fixtures-matrix [RELEASE=0.4.3] [CASE=dtypes]
fixtures-matrix:
	python3.11 fixtures/matrix/make_matrix.py $(if $(RELEASE),--release $(RELEASE)) $(if $(CASE),--case $(CASE))

bench: $(STAMP)
	$(PY) bench/bench_ls_inspect.py
	$(PY) bench/bench_du.py
	$(PY) bench/bench_verify.py
	$(PY) bench/bench_reshard.py
	$(PY) bench/bench_migrate.py
	$(PY) bench/bench_scale.py
	$(PY) bench/bench_remote.py
	$(PY) bench/bench_export.py
	$(PY) bench/bench_cp.py
	$(PY) bench/bench_model.py --json

clean:
	rm -rf $(VENV) demo_runs bench/out site .pytest_cache .mypy_cache .ruff_cache
