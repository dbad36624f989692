"""The engine's parts below the public facade: its config (``engine.config``), request bookkeeping
(``engine.requests``), the device-resident decode state (``engine.decode_state``), the fast path's
prompt chunks (``engine.prefill``) and the fast step that launches both and reads them back
(``engine.fast_step``). Import the modules themselves: this package file imports nothing, so a low
module (the K/V store, a policy) can use ``engine.config``'s checks without pulling in the engine."""
