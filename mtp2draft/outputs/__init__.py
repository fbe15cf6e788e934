"""Writing outputs safely: all-or-nothing directories (`directories`), claims on them (`claims`), the identity
of a directory as read (`identity`), distill's checkpoint folder (`checkpoint_folder`), and the streamed safetensors
writer (`writer`)."""
