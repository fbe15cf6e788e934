"""EAGLE-3 from an MTP layer: the weight transfers that initialise the EAGLE-3 layer (`transfer`) and the attention
transfers per attention kind (`attention`). The EAGLE-3 module is in `draft.modules`, its config codec in
`draft.eagle3_config`, its calibration in `train.calibrate`."""
