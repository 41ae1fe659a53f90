"""Instruction tuning: the instruction set (stage instructions), the fine-tune of the base model
(stage sft) and the chat format they share (marin.data.chat)."""
