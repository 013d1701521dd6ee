//! Pictures in Arrow columns.
//!
//! A frame travels as a Binary column of RGB8 pixels with `width` and `height` columns giving
//! the picture's size: the size results (boxes, crops) are mapped back to. A source that has
//! already scaled the pixels for the first stage (a decoder converting and scaling in one
//! pass from its YUV) says so on the pixel column's field, under
//! [`PIXELS_SIZE_KEY`]: every row's pixels are then that size, and `width` / `height` still
//! give the picture's own.
//!
//! ```
//! use arrow_schema::{DataType, Field};
//! use riffle_formats::picture::{pixels_size, with_pixels_size};
//!
//! let field = Field::new("pixels", DataType::Binary, false);
//! assert_eq!(pixels_size(&field), None);
//! let scaled = with_pixels_size(field, (300, 300));
//! assert_eq!(pixels_size(&scaled), Some((300, 300)));
//! ```

use arrow_schema::Field;

/// Field-metadata key of a pixel column whose rows are all scaled to one size (`"300x300"`).
pub const PIXELS_SIZE_KEY: &str = "riffle.pixels.size";

/// The size every row of this pixel column was scaled to, if a source scaled them.
pub fn pixels_size(field: &Field) -> Option<(u32, u32)> {
    let text = field.metadata().get(PIXELS_SIZE_KEY)?;
    let (w, h) = text.split_once('x')?;
    Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
}

/// `field` marked as holding pixels scaled to `(width, height)`.
pub fn with_pixels_size(field: Field, (width, height): (u32, u32)) -> Field {
    let mut metadata = field.metadata().clone();
    metadata.insert(PIXELS_SIZE_KEY.to_string(), format!("{width}x{height}"));
    field.with_metadata(metadata)
}
