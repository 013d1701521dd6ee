//! The region of a frame a detection's crop is cut from: its box grown by `padding`, clipped
//! to the frame and rounded outwards to whole pixels.

/// A crop region in whole pixels: left, top, width, height.
pub type Region = [u32; 4];

/// The region of the image (`width` × `height`) cut for box `rect` grown by `padding`, or
/// `None` when the box clipped to the image is under `min_size` pixels wide or high.
pub fn crop_region(
    rect: [f32; 4],
    padding: f32,
    min_size: f32,
    width: u32,
    height: u32,
) -> Option<Region> {
    let (w, h) = (width as f32, height as f32);
    let (x1, x2) = (rect[0].min(rect[2]), rect[0].max(rect[2]));
    let (y1, y2) = (rect[1].min(rect[3]), rect[1].max(rect[3]));
    let visible_w = x2.min(w) - x1.max(0.0);
    let visible_h = y2.min(h) - y1.max(0.0);
    if !(visible_w >= min_size && visible_h >= min_size) {
        return None;
    }
    let (px, py) = ((x2 - x1) * padding, (y2 - y1) * padding);
    let left = (x1 - px).max(0.0).floor();
    let top = (y1 - py).max(0.0).floor();
    let right = (x2 + px).min(w).ceil();
    let bottom = (y2 + py).min(h).ceil();
    // Within the image (clamped above), so the casts cannot overflow.
    let region = [
        left as u32,
        top as u32,
        (right - left) as u32,
        (bottom - top) as u32,
    ];
    (region[2] > 0 && region[3] > 0).then_some(region)
}
