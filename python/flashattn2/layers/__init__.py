"""flash-attn's helper layers, written for flashattn2: ``flashattn2.layers.rotary``."""
