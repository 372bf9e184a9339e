"""What the translation experiments and the translation cost benchmark share: the
DataModule attributes every seq2seq model is given (:data:`LINKS`), and where the
Differentiable Window paper places each attention in the translation Transformer, as
TransformerSeq2Seq's command-line flags (its Table 1 rows, and the rows of the training-cost
grid, :data:`COST_ROWS`).

Held beside the models so that experiments/ (coda_mt, dwin_mt, qadm_mt, coda_text2code) and
benchmarks/model_cost.py read the same lists: benchmarks may import lit_models, never
experiments.
"""

from __future__ import annotations

#: (DataModule attribute, model argument) pairs linked for every seq2seq model
LINKS = [("src_vocab_size", "src_vocab_size"), ("tgt_vocab_size", "tgt_vocab_size"),
         ("pad_id", "pad_id"), ("bos_id", "bos_id"), ("eos_id", "eos_id")]

PARTIAL = ["--model.attention_layers=3"]
SEGMENT = 5
ENC_AW = ["--model.encoder_attention=window", "--model.encoder_attention.variant=aw"]
DEC_MW = ["--model.decoder_attention=window", "--model.decoder_attention.variant=mw"]
CR_AW_SEG = ["--model.cross_attention=window", "--model.cross_attention.variant=aw",
             f"--model.cross_attention.segment_size={SEGMENT}"]
# Table 1 rows: the baselines (Shaw et al. 2018 relative positions in both self-attentions;
# Yang et al. 2018 localness in the encoder's lower 3 layers, their best setting) and ours
TABLE1_ROWS = {
    "transformer": [],
    "relative": ["--model.encoder_attention=relative", "--model.decoder_attention=relative"],
    "localness": ["--model.encoder_attention=localness"] + PARTIAL,
    "enc_aw-dec_mw": ENC_AW + DEC_MW + PARTIAL,
    "cr_aw_seg": CR_AW_SEG + PARTIAL,
    "enc_aw-cr_aw_seg-dec_mw": ENC_AW + CR_AW_SEG + DEC_MW + PARTIAL,
}
#: the cost grid's rows (issue 18 item 3: DW Table 4's measure for every mechanism of Table 5
#: in the translation model): each placed as Table 1 places it (relative in both
#: self-attentions; localness, MW and AW in the encoder's lower 3 layers), the paper's Table 4
#: window model, and CoDA Table 4's model (CoDA in every attention module)
COST_ROWS = {
    "transformer": [],
    "relative": TABLE1_ROWS["relative"],
    "localness": TABLE1_ROWS["localness"],
    "enc_mw": ["--model.encoder_attention=window", "--model.encoder_attention.variant=mw"]
              + PARTIAL,
    "enc_aw": ENC_AW + PARTIAL,
    "enc_aw-cr_aw_seg-dec_mw": TABLE1_ROWS["enc_aw-cr_aw_seg-dec_mw"],
    "coda": ["--model.attention=coda"],
}
